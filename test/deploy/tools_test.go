package main

import (
	"os"
	"strings"
	"testing"
)

func TestPrometheusRuleKeepsTheRules(t *testing.T) {
	src := []byte(`# file comment
groups:
  - name: g
    rules:
      # a comment
      - alert: A
        expr: |
          up == 0
            and on() vector(1)
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: "s"
`)
	out, err := PrometheusRule(src, "rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	pr, err := StrictPrometheusRule(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if pr.Kind != "PrometheusRule" || pr.Name != "proxyhealth" || len(pr.Spec.Groups) != 1 || pr.Spec.Groups[0].Rules[0].Alert != "A" {
		t.Fatalf("unexpected object:\n%s", out)
	}
	for _, want := range []string{"# a comment", "# file comment", "expr: |", "Generated from rules.yml"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestPrometheusRuleRefusesUnknownFields(t *testing.T) {
	_, err := PrometheusRule([]byte("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        severity: page\n"), "x")
	if err == nil || !strings.Contains(err.Error(), "severity") {
		t.Fatalf("want an unknown-field error naming severity, got %v", err)
	}
}

// TestGeneratedPrometheusRuleIsCurrent: the checked-in PrometheusRule is what the rules file
// generates.
func TestGeneratedPrometheusRuleIsCurrent(t *testing.T) {
	src, err := os.ReadFile("../../alerts/proxyhealth.rules.yml")
	if err != nil {
		t.Fatalf("no rules file: %v", err)
	}
	want, err := PrometheusRule(src, "alerts/proxyhealth.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../deploy/prometheus-operator/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("deploy/prometheus-operator/prometheusrule.yaml is not what alerts/proxyhealth.rules.yml generates: run make deploy-generate")
	}
}
