//go:build linux

// Package controlplane starts the real etcd and kube-apiserver the benchmarks measure against,
// inside a network namespace: credentials, command lines, and waiting until the apiserver
// serves.
package controlplane

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
	"strconv"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/nsproc"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The control plane's addresses, on its namespace's loopback.
const (
	EtcdClientAddr = "127.0.0.1:2379"
	EtcdPeerAddr   = "127.0.0.1:2380"
	APIServerAddr  = "127.0.0.1:6443"
)

// Options says where and how the control plane runs.
type Options struct {
	// Dir holds the credentials WriteCredentials wrote, the apiserver's certificates and
	// the logs.
	Dir string
	// EtcdDir holds etcd's data (in EtcdDir/data), e.g. on tmpfs or kept between runs.
	EtcdDir string
	// Token is the admin's bearer token, as given to WriteCredentials.
	Token string
	// Bind is the apiserver's --bind-address, Advertise its --advertise-address.
	Bind, Advertise string
	// ServiceCIDR is the apiserver's --service-cluster-ip-range.
	ServiceCIDR string
	// APIServerArgs are added to kube-apiserver's command line (feature gates, say).
	APIServerArgs []string
	// Start runs a process in the namespace; nil is nsproc.Start in the namespace, logging
	// to Dir. A benchmark passes its own to account for the processes (cgroups, a list).
	Start func(name string, args ...string) (*nsproc.Proc, error)
}

// ControlPlane is etcd and kube-apiserver, and an admin client of that apiserver.
type ControlPlane struct {
	Etcd, APIServer *nsproc.Proc
	Client          kubernetes.Interface
}

// Stop ends the apiserver, then etcd.
func (cp *ControlPlane) Stop() {
	if cp == nil {
		return
	}
	cp.APIServer.Stop()
	cp.Etcd.Stop()
}

// Start starts etcd and kube-apiserver in namespace ns and waits until the apiserver is ready
// and the default namespace exists. On failure it stops what it started.
func Start(ctx context.Context, ns string, bins kubelab.Binaries, o Options) (*ControlPlane, error) {
	start := o.Start
	if start == nil {
		start = func(name string, args ...string) (*nsproc.Proc, error) {
			return nsproc.Start(ns, o.Dir, name, args...)
		}
	}
	cp := &ControlPlane{}
	var err error
	if cp.Etcd, err = start("etcd", bins.Etcd,
		"--name", "bench",
		"--data-dir", filepath.Join(o.EtcdDir, "data"),
		"--listen-client-urls", "http://"+EtcdClientAddr,
		"--advertise-client-urls", "http://"+EtcdClientAddr,
		"--listen-peer-urls", "http://"+EtcdPeerAddr,
		"--initial-advertise-peer-urls", "http://"+EtcdPeerAddr,
		"--initial-cluster", "bench=http://"+EtcdPeerAddr,
		"--snapshot-count", "100000",
		"--quota-backend-bytes", strconv.Itoa(8<<30),
		"--log-level", "warn",
		"--logger", "zap",
	); err != nil {
		return nil, err
	}
	apiserverArgs := []string{bins.APIServer,
		"--etcd-servers", "http://" + EtcdClientAddr,
		"--bind-address", o.Bind,
		"--secure-port", strings.Split(APIServerAddr, ":")[1],
		"--advertise-address", o.Advertise,
		"--cert-dir", filepath.Join(o.Dir, "apiserver-certs"),
		"--token-auth-file", filepath.Join(o.Dir, "tokens.csv"),
		"--service-account-key-file", filepath.Join(o.Dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(o.Dir, "sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--authorization-mode", "RBAC",
		"--service-cluster-ip-range", o.ServiceCIDR,
		"--enable-priority-and-fairness=false",
		"--max-requests-inflight", "800",
		"--max-mutating-requests-inflight", "400",
		"--disable-admission-plugins", "ServiceAccount,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy,ResourceQuota,LimitRanger,StorageObjectInUseProtection,PersistentVolumeClaimResize,RuntimeClass,DefaultIngressClass",
		"--profiling=false",
		"--v", "1",
	}
	if cp.APIServer, err = start("kube-apiserver", append(apiserverArgs, o.APIServerArgs...)...); err != nil {
		cp.Stop()
		return nil, err
	}
	if err := cp.waitReady(ctx, ns, o.Token); err != nil {
		cp.Stop()
		return nil, err
	}
	return cp, nil
}

func (cp *ControlPlane) waitReady(ctx context.Context, ns, token string) error {
	client, err := kubernetes.NewForConfig(&rest.Config{
		Host:            "https://" + APIServerAddr,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		Dial:            netnsdial.Dialer(ns),
		QPS:             -1, // no client-side rate limit: a benchmark's workers are the limit
		Timeout:         30 * time.Second,
		WarningHandler:  rest.NoWarnings{},
	})
	if err != nil {
		return fmt.Errorf("apiserver client: %w", err)
	}
	cp.Client = client
	err = benchrun.WaitFor(ctx, 120*time.Second, "kube-apiserver /readyz", func() (bool, string, error) {
		if cp.Etcd.Exited() || cp.APIServer.Exited() {
			return false, "", fmt.Errorf("etcd or kube-apiserver exited:\n%s\n%s", cp.Etcd.Tail(), cp.APIServer.Tail())
		}
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(c)
		return err == nil, fmt.Sprintf("%v: %s", err, body), nil
	})
	if err != nil {
		return err
	}
	return benchrun.WaitFor(ctx, 60*time.Second, "namespace default", func() (bool, string, error) {
		_, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err), nil
	})
}

// RandomToken is a fresh bearer token.
func RandomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// WriteCredentials writes into dir the token file (one admin, token, in system:masters), the
// service-account key pair and admin.kubeconfig for the apiserver at server (host:port).
func WriteCredentials(dir, token, server string) (kubeconfig string, err error) {
	write := func(name string, content []byte, mode os.FileMode) (string, error) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, content, mode); err != nil {
			return "", fmt.Errorf("writing credentials: %w", err)
		}
		return p, nil
	}
	if _, err := write("tokens.csv", []byte(token+",admin,admin,\"system:masters\"\n"), 0o600); err != nil {
		return "", err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", fmt.Errorf("service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", fmt.Errorf("service-account key: %w", err)
	}
	if _, err := write("sa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return "", err
	}
	if _, err := write("sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return "", err
	}
	return write("admin.kubeconfig", []byte(kubelab.KubeconfigYAML(server, "admin", token)), 0o600)
}
