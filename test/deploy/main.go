// Command deploytool renders and generates proxyhealth's deployment manifests. It is a separate
// module so that kustomize and the Prometheus Operator's API types stay out of the exporter's
// go.mod.
//
//	deploytool render DIR                  the kustomization at DIR, as one YAML stream
//	deploytool prometheusrule RULES OUT    writes the PrometheusRule made from a Prometheus rules file
//	deploytool prometheusrule -check RULES OUT   fails when OUT is not what RULES generates
//	deploytool crds                        the PodMonitor, ServiceMonitor and PrometheusRule CRDs of the operator
//	                                       release whose API types this module uses
//	deploytool chart-files [-check] ROOT   writes (or checks) the files the chart at
//	                                       charts/proxyhealth carries from alerts/ and dashboards/
//	deploytool template CHART RELEASE NAMESPACE [VALUES...]
//	                                       the chart rendered as helm template does
//	deploytool install KUBECONFIG CHART RELEASE NAMESPACE [VALUES...]
//	deploytool upgrade KUBECONFIG CHART RELEASE NAMESPACE [VALUES...]
//	deploytool uninstall KUBECONFIG RELEASE NAMESPACE
//	                                       helm install (creating the namespace), upgrade and
//	                                       uninstall against the cluster of KUBECONFIG
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "deploytool:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: deploytool render DIR | prometheusrule [-check] RULES OUT | crds | chart-files [-check] ROOT | template CHART RELEASE NAMESPACE [VALUES...] | install|upgrade KUBECONFIG CHART RELEASE NAMESPACE [VALUES...] | uninstall KUBECONFIG RELEASE NAMESPACE")
	}
	switch args[0] {
	case "render":
		if len(args) != 2 {
			return errors.New("usage: deploytool render DIR")
		}
		out, err := render(args[1])
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(out)
		return err
	case "prometheusrule":
		check := false
		rest := args[1:]
		if len(rest) > 0 && rest[0] == "-check" {
			check, rest = true, rest[1:]
		}
		if len(rest) != 2 {
			return errors.New("usage: deploytool prometheusrule [-check] RULES OUT")
		}
		src, err := os.ReadFile(rest[0])
		if err != nil {
			return err
		}
		gen, err := PrometheusRule(src, repoPath(rest[0]))
		if err != nil {
			return err
		}
		if check {
			cur, err := os.ReadFile(rest[1])
			if err != nil {
				return err
			}
			if !bytes.Equal(cur, gen) {
				return fmt.Errorf("%s is not what %s generates: run make deploy-generate", rest[1], rest[0])
			}
			return nil
		}
		return os.WriteFile(rest[1], gen, 0o644)
	case "chart-files":
		rest := args[1:]
		if len(rest) == 2 && rest[0] == "-check" {
			return CheckChartFiles(rest[1])
		}
		if len(rest) != 1 {
			return errors.New("usage: deploytool chart-files [-check] ROOT")
		}
		return WriteChartFiles(rest[0])
	case "template":
		if len(args) < 4 {
			return errors.New("usage: deploytool template CHART RELEASE NAMESPACE [VALUES...]")
		}
		vals, err := readValues(args[4:]...)
		if err != nil {
			return err
		}
		out, err := RenderChart(args[1], args[2], args[3], vals)
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(out)
		return err
	case "install", "upgrade":
		if len(args) < 5 {
			return fmt.Errorf("usage: deploytool %s KUBECONFIG CHART RELEASE NAMESPACE [VALUES...]", args[0])
		}
		vals, err := readValues(args[5:]...)
		if err != nil {
			return err
		}
		act := InstallRelease
		if args[0] == "upgrade" {
			act = UpgradeRelease
		}
		rel, err := act(args[1], args[2], args[3], args[4], vals)
		if err != nil {
			return err
		}
		line, err := releaseSummary(rel)
		if err != nil {
			return err
		}
		_, err = fmt.Print(line)
		return err
	case "uninstall":
		if len(args) != 4 {
			return errors.New("usage: deploytool uninstall KUBECONFIG RELEASE NAMESPACE")
		}
		res, err := UninstallRelease(args[1], args[2], args[3])
		if err != nil {
			return err
		}
		_, err = fmt.Printf("release %s uninstalled\n", args[2])
		if res.Info != "" {
			fmt.Println(res.Info)
		}
		return err
	case "crds":
		out, err := crds()
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(out)
		return err
	}
	return fmt.Errorf("unknown command %q", args[0])
}

// repoPath names path relative to the proxyhealth repository that holds it (for the generated
// file's comment, whatever directory the tool runs in).
func repoPath(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return filepath.ToSlash(path)
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(mod, []byte("module github.com/proxyhealth/proxyhealth\n")) {
			rel, err := filepath.Rel(dir, abs)
			if err == nil {
				return filepath.ToSlash(rel)
			}
		}
		if filepath.Dir(dir) == dir {
			return filepath.ToSlash(path)
		}
	}
}

// render builds the kustomization at dir the way `kubectl kustomize` does.
func render(dir string) ([]byte, error) {
	opts := krusty.MakeDefaultOptions()
	m, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	return m.AsYaml()
}

// operatorModule is the Prometheus Operator release whose CRDs are loaded into the test
// apiserver; it is the release of the API types this module requires (go.mod).
const operatorModule = "github.com/prometheus-operator/prometheus-operator"

// crds returns the PodMonitor, ServiceMonitor and PrometheusRule CRDs from the operator's module source, fetched
// into the module cache with `go mod download` (checksum-verified like any module).
func crds() ([]byte, error) {
	version, err := apisVersion()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "mod", "download", "-json", operatorModule+"@"+version)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); jerr != nil || info.Error != "" || err != nil {
		return nil, fmt.Errorf("go mod download %s@%s: %v %s", operatorModule, version, err, info.Error)
	}
	var b bytes.Buffer
	for _, name := range []string{"monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"} {
		crd, err := os.ReadFile(filepath.Join(info.Dir, "example", "prometheus-operator-crd", name))
		if err != nil {
			return nil, err
		}
		b.WriteString("---\n")
		b.Write(crd)
	}
	return b.Bytes(), nil
}
