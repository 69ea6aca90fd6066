//go:build linux

package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/netnsdial"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The control plane's addresses, on the soak namespace's loopback. It is started the way the
// e2e lab and bench/rules-drift start it (their code is test-only or another command's); what
// is repeated here is the minimum: credentials and command lines.
const (
	etcdClientAddr = "127.0.0.1:2379"
	etcdPeerAddr   = "127.0.0.1:2380"
	apiserverAddr  = "127.0.0.1:6443"
	faultProxyAddr = "127.0.0.1:6444" // the exporter's way to the apiserver
	soakNodeName   = "soak-node"
)

// controlPlane is etcd and kube-apiserver in the namespace, and the fault proxy the exporter
// reaches the apiserver through.
type controlPlane struct {
	etcd, apiserver *proc
	proxy           *kubelab.FaultProxy
	kubeconfig      string // for the exporter, through the proxy
	stopProxy       func()
}

func (cp *controlPlane) stop() {
	if cp == nil {
		return
	}
	if cp.stopProxy != nil {
		cp.stopProxy()
	}
	cp.apiserver.stop()
	cp.etcd.stop()
}

func startControlPlane(ctx context.Context, ns, dir string, bins kubelab.Binaries) (*controlPlane, error) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(token+",admin,admin,\"system:masters\"\n"), 0o600); err != nil {
		return nil, err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return nil, err
	}
	cp := &controlPlane{kubeconfig: filepath.Join(dir, "exporter.kubeconfig")}
	if err := os.WriteFile(cp.kubeconfig, []byte(kubelab.KubeconfigYAML(faultProxyAddr, "admin", token)), 0o600); err != nil {
		return nil, err
	}
	if cp.etcd, err = startProc(ns, dir, "etcd", bins.Etcd,
		"--name", "soak", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://"+etcdClientAddr, "--advertise-client-urls", "http://"+etcdClientAddr,
		"--listen-peer-urls", "http://"+etcdPeerAddr, "--initial-advertise-peer-urls", "http://"+etcdPeerAddr,
		"--initial-cluster", "soak=http://"+etcdPeerAddr, "--log-level", "warn", "--logger", "zap"); err != nil {
		return nil, err
	}
	if cp.apiserver, err = startProc(ns, dir, "kube-apiserver", bins.APIServer,
		"--etcd-servers", "http://"+etcdClientAddr,
		"--bind-address", "127.0.0.1", "--secure-port", "6443", "--advertise-address", "172.18.0.2",
		"--cert-dir", filepath.Join(dir, "apiserver-certs"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--authorization-mode", "RBAC", "--service-cluster-ip-range", "10.96.0.0/16",
		"--enable-priority-and-fairness=false",
		"--disable-admission-plugins", "ServiceAccount,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy,ResourceQuota,LimitRanger,StorageObjectInUseProtection,PersistentVolumeClaimResize,RuntimeClass,DefaultIngressClass",
		"--profiling=false", "--v", "1"); err != nil {
		cp.stop()
		return nil, err
	}
	client, err := kubernetes.NewForConfig(&rest.Config{
		Host: "https://" + apiserverAddr, BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		Dial:            netnsdial.Dialer(ns), Timeout: 10 * time.Second, WarningHandler: rest.NoWarnings{},
	})
	if err != nil {
		cp.stop()
		return nil, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		c, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := client.CoreV1().Namespaces().Get(c, "default", metav1.GetOptions{})
		cancel()
		if err == nil {
			break
		}
		if cp.etcd.exited() || cp.apiserver.exited() || time.Now().After(deadline) || ctx.Err() != nil {
			cp.stop()
			return nil, fmt.Errorf("kube-apiserver not ready: %v\n%s\n%s", err, cp.etcd.tail(), cp.apiserver.tail())
		}
		time.Sleep(500 * time.Millisecond)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: soakNodeName, Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a"}}}
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		cp.stop()
		return nil, fmt.Errorf("creating the Node: %w", err)
	}
	ln, err := netnsdial.Listen(ns, "tcp4", faultProxyAddr)
	if err != nil {
		cp.stop()
		return nil, err
	}
	cp.proxy = kubelab.NewFaultProxy(apiserverAddr, netnsdial.Dialer(ns))
	go func() { _ = cp.proxy.Serve(ln) }()
	cp.stopProxy = func() { ln.Close(); cp.proxy.Reset() }
	return cp, nil
}
