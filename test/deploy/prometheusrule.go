package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	yamlv3 "gopkg.in/yaml.v3"
	"sigs.k8s.io/yaml"
)

const apisModule = "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring"

// apisVersion is the version of the operator's API types this binary was built with.
func apisVersion() (string, error) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", errors.New("no build information")
	}
	for _, d := range bi.Deps {
		if d.Path == apisModule {
			return d.Version, nil
		}
	}
	return "", fmt.Errorf("%s is not a dependency of this build", apisModule)
}

// PrometheusRule turns a Prometheus rules file (groups: ...) into a PrometheusRule named
// proxyhealth whose spec is that file, comments and block scalars kept. The rules are first
// decoded strictly into the operator's PrometheusRuleSpec, so a field the operator does not
// know fails here rather than in the cluster.
func PrometheusRule(rules []byte, source string) ([]byte, error) {
	if err := StrictSpec(rules); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(rules, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	if doc.Kind != yamlv3.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yamlv3.MappingNode {
		return nil, fmt.Errorf("%s: not a mapping", source)
	}
	spec := doc.Content[0]
	// The file's leading comment describes the file; it goes above the object.
	fileComment := ""
	for _, n := range []*yamlv3.Node{&doc, spec, spec.Content[0]} {
		if n.HeadComment != "" && fileComment == "" {
			fileComment = n.HeadComment
			n.HeadComment = ""
		}
	}

	str := func(v string) *yamlv3.Node { return &yamlv3.Node{Kind: yamlv3.ScalarNode, Value: v} }
	mapping := func(kv ...*yamlv3.Node) *yamlv3.Node { return &yamlv3.Node{Kind: yamlv3.MappingNode, Content: kv} }
	root := mapping(
		str("apiVersion"), str(monitoringv1.SchemeGroupVersion.String()),
		str("kind"), str(monitoringv1.PrometheusRuleKind),
		str("metadata"), mapping(
			str("name"), str("proxyhealth"),
			str("labels"), mapping(str("app.kubernetes.io/name"), str("proxyhealth")),
		),
		str("spec"), spec,
	)
	root.HeadComment = fmt.Sprintf("Generated from %s by `make deploy-generate`: edit that file, not this one.", source)
	if fileComment != "" {
		root.HeadComment += "\n\n" + fileComment
	}
	var b bytes.Buffer
	enc := yamlv3.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&yamlv3.Node{Kind: yamlv3.DocumentNode, Content: []*yamlv3.Node{root}}); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	// The result must say the same as the source.
	if err := sameSpec(rules, b.Bytes()); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// StrictSpec decodes a rules file into the operator's PrometheusRuleSpec, refusing unknown
// fields.
func StrictSpec(rules []byte) error {
	_, err := strictSpec(rules)
	return err
}

func strictSpec(rules []byte) (monitoringv1.PrometheusRuleSpec, error) {
	var spec monitoringv1.PrometheusRuleSpec
	j, err := yaml.YAMLToJSON(rules)
	if err != nil {
		return spec, err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return spec, fmt.Errorf("not a PrometheusRule spec: %w", err)
	}
	if len(spec.Groups) == 0 {
		return spec, errors.New("no rule groups")
	}
	return spec, nil
}

// StrictPrometheusRule decodes a whole PrometheusRule object, refusing unknown fields.
func StrictPrometheusRule(obj []byte) (monitoringv1.PrometheusRule, error) {
	var pr monitoringv1.PrometheusRule
	j, err := yaml.YAMLToJSON(obj)
	if err != nil {
		return pr, err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	err = dec.Decode(&pr)
	return pr, err
}

func sameSpec(rules, generated []byte) error {
	want, err := strictSpec(rules)
	if err != nil {
		return err
	}
	pr, err := StrictPrometheusRule(generated)
	if err != nil {
		return fmt.Errorf("generated PrometheusRule: %w", err)
	}
	a, _ := json.Marshal(want)
	b, _ := json.Marshal(pr.Spec)
	if !bytes.Equal(a, b) {
		return errors.New("generated PrometheusRule's spec differs from the rules file")
	}
	return nil
}
