package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// releaseTimeout bounds each install, upgrade and uninstall: the objects are created and
// deleted, never waited on (the lab's apiserver runs no controllers or kubelet, so no pod
// ever becomes ready).
const releaseTimeout = time.Minute

// releaseConfig is Helm's action configuration for the cluster of kubeconfig, with release
// records kept as Secrets in namespace (the CLI's default driver). Discovery is cached in a
// directory of its own, removed by cleanup: the default, ~/.kube/cache, is keyed by the
// server's address, which every lab apiserver shares, and would serve one lab's API groups
// to the next for hours.
func releaseConfig(kubeconfig, namespace string) (cfg *action.Configuration, cleanup func(), err error) {
	cacheDir, err := os.MkdirTemp("", "deploytool-kube-cache-")
	if err != nil {
		return nil, nil, fmt.Errorf("discovery cache directory: %w", err)
	}
	cleanup = func() { os.RemoveAll(cacheDir) }
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kubeconfig
	flags.Namespace = &namespace
	flags.CacheDir = &cacheDir
	cfg = new(action.Configuration)
	debug := func(format string, v ...any) { slog.Debug(fmt.Sprintf(format, v...)) }
	if err := cfg.Init(flags, namespace, "secret", debug); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("helm configuration for %s: %w", kubeconfig, err)
	}
	return cfg, cleanup, nil
}

// releaseAndChart is the Helm configuration for namespace and the chart at dir; cleanup
// releases the configuration.
func releaseAndChart(kubeconfig, dir, namespace string) (*action.Configuration, *chart.Chart, func(), error) {
	cfg, cleanup, err := releaseConfig(kubeconfig, namespace)
	if err != nil {
		return nil, nil, nil, err
	}
	ch, err := loader.Load(dir)
	if err != nil {
		cleanup()
		return nil, nil, nil, fmt.Errorf("load chart %s: %w", dir, err)
	}
	return cfg, ch, cleanup, nil
}

// InstallRelease installs the chart at dir as `helm install RELEASE DIR -n NAMESPACE
// --create-namespace -f VALUES...` does.
func InstallRelease(kubeconfig, dir, name, namespace string, vals map[string]any) (*release.Release, error) {
	cfg, ch, cleanup, err := releaseAndChart(kubeconfig, dir, namespace)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	install := action.NewInstall(cfg)
	install.ReleaseName = name
	install.Namespace = namespace
	install.CreateNamespace = true
	install.Timeout = releaseTimeout
	rel, err := install.Run(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("helm install %s -n %s: %w", name, namespace, err)
	}
	return rel, nil
}

// UpgradeRelease upgrades the release to the chart at dir with vals, as `helm upgrade RELEASE
// DIR -n NAMESPACE -f VALUES...` does: the chart's defaults plus vals, the previous values
// not reused.
func UpgradeRelease(kubeconfig, dir, name, namespace string, vals map[string]any) (*release.Release, error) {
	cfg, ch, cleanup, err := releaseAndChart(kubeconfig, dir, namespace)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	upgrade := action.NewUpgrade(cfg)
	upgrade.Namespace = namespace
	upgrade.Timeout = releaseTimeout
	rel, err := upgrade.Run(name, ch, vals)
	if err != nil {
		return nil, fmt.Errorf("helm upgrade %s -n %s: %w", name, namespace, err)
	}
	return rel, nil
}

// UninstallRelease uninstalls the release as `helm uninstall RELEASE -n NAMESPACE` does: its
// objects and its history go.
func UninstallRelease(kubeconfig, name, namespace string) (*release.UninstallReleaseResponse, error) {
	cfg, cleanup, err := releaseConfig(kubeconfig, namespace)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	uninstall := action.NewUninstall(cfg)
	uninstall.Timeout = releaseTimeout
	// Background (the CLI's default): dependents are left to the garbage collector.
	uninstall.DeletionPropagation = "background"
	res, err := uninstall.Run(name)
	if err != nil {
		return nil, fmt.Errorf("helm uninstall %s -n %s: %w", name, namespace, err)
	}
	return res, nil
}

// releaseSummary is one line on a release, for the tool's output.
func releaseSummary(rel *release.Release) (string, error) {
	if rel == nil || rel.Info == nil {
		return "", errors.New("helm returned no release")
	}
	return fmt.Sprintf("release %s in %s: revision %d %s\n", rel.Name, rel.Namespace, rel.Version, rel.Info.Status), nil
}
