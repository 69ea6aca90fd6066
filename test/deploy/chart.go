package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"sigs.k8s.io/yaml"
)

// The chart, relative to the repository's root, and the files it carries from elsewhere in the
// repository: they are generated (make deploy-generate), never edited, and a test fails when
// they differ from their sources.
const (
	chartDir         = "charts/proxyhealth"
	chartRules       = chartDir + "/files/proxyhealth.rules.yml"
	chartDashboards  = chartDir + "/files/dashboards"
	sourceRules      = "alerts/proxyhealth.rules.yml"
	sourceDashboards = "dashboards"
)

// ChartFiles returns the chart's generated files, by path from the repository's root, as the
// sources under root make them: the rules file with a header naming its source, and each
// dashboards/*.json byte for byte (JSON has no comments).
func ChartFiles(root string) (map[string][]byte, error) {
	out := map[string][]byte{}
	rules, err := os.ReadFile(filepath.Join(root, sourceRules))
	if err != nil {
		return nil, err
	}
	if err := StrictSpec(rules); err != nil {
		return nil, fmt.Errorf("%s: %w", sourceRules, err)
	}
	header := fmt.Sprintf("# Generated from %s by `make deploy-generate`: edit that file, not this one.\n\n", sourceRules)
	out[chartRules] = append([]byte(header), rules...)
	dashboards, err := filepath.Glob(filepath.Join(root, sourceDashboards, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(dashboards) == 0 {
		return nil, fmt.Errorf("no dashboards in %s", filepath.Join(root, sourceDashboards))
	}
	for _, d := range dashboards {
		b, err := os.ReadFile(d)
		if err != nil {
			return nil, err
		}
		out[chartDashboards+"/"+filepath.Base(d)] = b
	}
	return out, nil
}

// chartFilesPresent lists the generated files the chart holds now.
func chartFilesPresent(root string) ([]string, error) {
	present := []string{}
	if _, err := os.Stat(filepath.Join(root, chartRules)); err == nil {
		present = append(present, chartRules)
	}
	dashboards, err := filepath.Glob(filepath.Join(root, chartDashboards, "*"))
	if err != nil {
		return nil, err
	}
	for _, d := range dashboards {
		present = append(present, chartDashboards+"/"+filepath.Base(d))
	}
	return present, nil
}

// WriteChartFiles writes the chart's generated files and removes those whose source is gone.
func WriteChartFiles(root string) error {
	want, err := ChartFiles(root)
	if err != nil {
		return err
	}
	present, err := chartFilesPresent(root)
	if err != nil {
		return err
	}
	for _, p := range present {
		if _, ok := want[p]; !ok {
			if err := os.Remove(filepath.Join(root, p)); err != nil {
				return err
			}
		}
	}
	for p, b := range want {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(root, p), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// CheckChartFiles fails, naming each file, when the chart's generated files are not what their
// sources make.
func CheckChartFiles(root string) error {
	want, err := ChartFiles(root)
	if err != nil {
		return err
	}
	present, err := chartFilesPresent(root)
	if err != nil {
		return err
	}
	var problems []string
	for _, p := range present {
		if _, ok := want[p]; !ok {
			problems = append(problems, p+" has no source")
		}
	}
	for p, b := range want {
		got, err := os.ReadFile(filepath.Join(root, p))
		switch {
		case errors.Is(err, os.ErrNotExist):
			problems = append(problems, p+" is missing")
		case err != nil:
			return err
		case !bytes.Equal(got, b):
			problems = append(problems, p+" differs from its source")
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fmt.Errorf("the chart's generated files are stale (run make deploy-generate): %s", strings.Join(problems, "; "))
	}
	return nil
}

// readValues reads Helm values files, merged in order as helm's -f does.
func readValues(files ...string) (map[string]any, error) {
	vals := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var v map[string]any
		if err := yaml.Unmarshal(b, &v); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		vals = chartutil.CoalesceTables(v, vals)
	}
	return vals, nil
}

// RenderChart renders the chart at dir as `helm template NAME DIR -n NAMESPACE -f VALUES...`
// does, and returns the manifest stream.
func RenderChart(dir, release, namespace string, vals map[string]any) ([]byte, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, err
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = release
	install.Namespace = namespace
	rel, err := install.Run(ch, vals)
	if err != nil {
		return nil, err
	}
	return []byte(rel.Manifest), nil
}

// LintChart lints the chart at dir with vals as `helm lint --strict` does: a warning fails.
func LintChart(dir, namespace string, vals map[string]any) error {
	lint := action.NewLint()
	lint.Strict = true
	lint.Namespace = namespace
	res := lint.Run([]string{dir}, vals)
	if len(res.Errors) == 0 {
		return nil
	}
	var msgs []string
	for _, m := range res.Messages {
		msgs = append(msgs, m.Error())
	}
	for _, e := range res.Errors {
		msgs = append(msgs, e.Error())
	}
	return errors.New(strings.Join(msgs, "\n"))
}
