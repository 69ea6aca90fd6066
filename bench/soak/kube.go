//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/proxyhealth/proxyhealth/bench/internal/controlplane"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The exporter reaches the apiserver (bench/internal/controlplane, on the soak namespace's
// loopback) through a fault proxy that can black-hole it.
const (
	faultProxyAddr = "127.0.0.1:6444"
	soakNodeName   = "soak-node"
)

// controlPlane is etcd and kube-apiserver in the namespace, and the fault proxy the exporter
// reaches the apiserver through.
type controlPlane struct {
	*controlplane.ControlPlane
	proxy      *kubelab.FaultProxy
	kubeconfig string // for the exporter, through the proxy
	stopProxy  func()
}

func (cp *controlPlane) stop() {
	if cp == nil {
		return
	}
	if cp.stopProxy != nil {
		cp.stopProxy()
	}
	cp.Stop()
}

func startControlPlane(ctx context.Context, ns, dir string, bins kubelab.Binaries) (*controlPlane, error) {
	token := controlplane.RandomToken()
	kubeconfig, err := controlplane.WriteCredentials(dir, token, faultProxyAddr)
	if err != nil {
		return nil, err
	}
	etcdDir := filepath.Join(dir, "etcd")
	if err := os.MkdirAll(etcdDir, 0o700); err != nil {
		return nil, err
	}
	started, err := controlplane.Start(ctx, ns, bins, controlplane.Options{
		Dir: dir, EtcdDir: etcdDir, Token: token,
		Bind: "127.0.0.1", Advertise: "172.18.0.2", ServiceCIDR: "10.96.0.0/16",
	})
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{ControlPlane: started, kubeconfig: kubeconfig}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: soakNodeName, Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a"}}}
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		cp.stop()
		return nil, fmt.Errorf("creating the Node: %w", err)
	}
	ln, err := netnsdial.Listen(ns, "tcp4", faultProxyAddr)
	if err != nil {
		cp.stop()
		return nil, err
	}
	cp.proxy = kubelab.NewFaultProxy(controlplane.APIServerAddr, netnsdial.Dialer(ns))
	go func() { _ = cp.proxy.Serve(ln) }()
	cp.stopProxy = func() { ln.Close(); cp.proxy.Reset() }
	return cp, nil
}
