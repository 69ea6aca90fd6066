//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

const (
	deployExporterPort = 19890
	noWatchPort        = 19891
	noListPort         = 19892
	noListPagedPort    = 19893
)

// deployTool builds test/deploy (a separate module: kustomize, Helm and the Prometheus
// Operator's types).
func deployTool(t *testing.T) *deployToolCmd {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "deploytool")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(root, "test", "deploy")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building test/deploy: %v\n%s", err, out)
	}
	// crds runs `go mod download` in the tool's module; paths given are relative to it.
	return &deployToolCmd{t: t, bin: bin, dir: cmd.Dir}
}

// deployToolCmd runs the built test/deploy tool.
type deployToolCmd struct {
	t        *testing.T
	bin, dir string
}

// Run runs the tool with args and returns its standard output; a failure fails the test.
func (d *deployToolCmd) Run(args ...string) []byte {
	d.t.Helper()
	return d.run(exec.Command(d.bin, args...))
}

// RunIn is Run inside network namespace ns (where the lab's apiserver listens).
func (d *deployToolCmd) RunIn(ns string, args ...string) []byte {
	d.t.Helper()
	return d.run(exec.Command("ip", append([]string{"netns", "exec", ns, d.bin}, args...)...))
}

func (d *deployToolCmd) run(cmd *exec.Cmd) []byte {
	d.t.Helper()
	cmd.Dir = d.dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		d.t.Fatalf("deploytool %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, stderr.String())
	}
	return out
}

// decodeObjects splits a YAML stream into objects.
func decodeObjects(t *testing.T, stream []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatal(err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// deployClients is the admin's dynamic client and a REST mapper that sees CRDs added later.
type deployClients struct {
	dyn    dynamic.Interface
	disc   discovery.DiscoveryInterface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newDeployClients(t *testing.T, cp *ControlPlane) *deployClients {
	t.Helper()
	cfg := &rest.Config{
		Host:            "https://" + apiserverAddr,
		BearerToken:     cp.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		Dial:            netnsdial.Dialer(cp.Lab.Node),
		// Listing every resource (helm_release) is a few hundred requests: not throttled.
		QPS:            100,
		Burst:          200,
		Timeout:        20 * time.Second,
		WarningHandler: rest.NoWarnings{},
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &deployClients{dyn: dyn, disc: disc, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

func (c *deployClients) resource(t *testing.T, obj *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	gvk := obj.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		c.mapper.Reset()
		if m, err = c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			t.Fatalf("%s: %v", gvk, err)
		}
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = "default"
		}
		return c.dyn.Resource(m.Resource).Namespace(ns)
	}
	return c.dyn.Resource(m.Resource)
}

// create creates obj, for real or as a server-side dry run, with strict field validation (an
// unknown or duplicate field is an error, not a warning).
func (c *deployClients) create(t *testing.T, obj *unstructured.Unstructured, dryRun bool) error {
	t.Helper()
	opts := metav1.CreateOptions{FieldManager: "proxyhealth-e2e", FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err := c.resource(t, obj).Create(context.Background(), obj, opts)
	return err
}

func describe(o *unstructured.Unstructured) string {
	if o.GetNamespace() != "" {
		return fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
	}
	return fmt.Sprintf("%s %s", o.GetKind(), o.GetName())
}

// TestDeployManifests validates deploy/ and charts/proxyhealth against the lab's real
// kube-apiserver (v1.36): the kustomize renderings (krusty, as `kubectl kustomize`) of the base
// and of the example overlay, and the chart rendered with each of its ci/ values files, are
// created with a server-side dry run and strict field validation, the monitors and
// PrometheusRule against the Prometheus Operator's own CRDs loaded into the apiserver. The
// chart is then installed, upgraded and uninstalled for real (testHelmRelease). Then the RBAC
// is proven: the overlay's ServiceAccount, ClusterRole and ClusterRoleBinding are created for
// real, the exporter runs in the lab node with that ServiceAccount's token, and its API view
// becomes fresh and its drift check succeeds; with the ClusterRole lacking list or watch on
// EndpointSlices it never becomes fresh.
func TestDeployManifests(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	tool := deployTool(t)
	overlay := decodeObjects(t, tool.Run("render", "../../deploy/overlays/example"))
	base := decodeObjects(t, tool.Run("render", "../../deploy/base"))
	crds := decodeObjects(t, tool.Run("crds"))

	// The exporter's own objects: its DaemonSet's ServiceAccount, the ClusterRoleBinding of
	// that account and the ClusterRole it binds (the overlay also ships a viewer account for
	// the kubectl plugin, with a role and binding of its own).
	kinds := map[string]*unstructured.Unstructured{}
	for _, o := range overlay {
		if o.GetKind() == "DaemonSet" || kinds[o.GetKind()] == nil {
			kinds[o.GetKind()] = o
		}
	}
	if ds := kinds["DaemonSet"]; ds != nil {
		account, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "serviceAccountName")
		var role string
		for _, o := range overlay {
			switch o.GetKind() {
			case "ServiceAccount":
				if o.GetName() == account {
					kinds["ServiceAccount"] = o
				}
			case "ClusterRoleBinding":
				subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
				if len(subjects) == 1 && subjects[0].(map[string]any)["name"] == account {
					kinds["ClusterRoleBinding"] = o
					role, _, _ = unstructured.NestedString(o.Object, "roleRef", "name")
				}
			}
		}
		for _, o := range overlay {
			if o.GetKind() == "ClusterRole" && o.GetName() == role {
				kinds["ClusterRole"] = o
			}
		}
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "PodMonitor", "PrometheusRule"} {
		if kinds[k] == nil {
			t.Fatalf("the example overlay renders no %s", k)
		}
	}
	ns := kinds["Namespace"].GetName()
	subjects, _, _ := unstructured.NestedSlice(kinds["ClusterRoleBinding"].Object, "subjects")
	if len(subjects) != 1 || subjects[0].(map[string]any)["namespace"] != ns || subjects[0].(map[string]any)["name"] != kinds["ServiceAccount"].GetName() {
		t.Fatalf("the ClusterRoleBinding's subject is not the ServiceAccount in %s: %v", ns, subjects)
	}

	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true})
	c := newDeployClients(t, cp)

	// The operator's CRDs, for real, then wait until they serve.
	for _, crd := range crds {
		if err := c.create(t, crd, false); err != nil {
			t.Fatalf("creating %s: %v", describe(crd), err)
		}
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, crd := range crds {
		waitFor(t, 30*time.Second, describe(crd)+" established", func() (bool, string) {
			got, err := c.dyn.Resource(crdGVR).Get(context.Background(), crd.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, cond := range conds {
				m := cond.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, ""
				}
			}
			return false, fmt.Sprint(conds)
		})
	}
	c.mapper.Reset()

	t.Run("base_dry_run", func(t *testing.T) {
		for _, o := range base {
			// Namespaced objects in "default", explicitly: an overlay moves them and the
			// binding's subject together, and kubectl -n cannot move them alone.
			want := "default"
			if o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding" {
				want = ""
			}
			if o.GetNamespace() != want {
				t.Errorf("the base puts %s in namespace %q, want %q", describe(o), o.GetNamespace(), want)
			}
			if err := c.create(t, o, true); err != nil {
				t.Errorf("dry run of %s: %v", describe(o), err)
			}
		}
	})
	t.Run("overlay_dry_run", func(t *testing.T) {
		// The namespace first: the dry run of what goes in it needs it to exist.
		if err := c.create(t, kinds["Namespace"], true); err != nil {
			t.Fatalf("dry run of %s: %v", describe(kinds["Namespace"]), err)
		}
		if err := c.create(t, kinds["Namespace"], false); err != nil {
			t.Fatalf("creating %s: %v", describe(kinds["Namespace"]), err)
		}
		for _, o := range overlay {
			if o.GetKind() == "Namespace" {
				continue
			}
			if err := c.create(t, o, true); err != nil {
				t.Errorf("dry run of %s: %v", describe(o), err)
			} else {
				t.Logf("dry run of %s: accepted", describe(o))
			}
		}
		// A field the CRD does not know is refused: the CRD's schema is really applied.
		pm := kinds["PodMonitor"].DeepCopy()
		_ = unstructured.SetNestedField(pm.Object, "x", "spec", "noSuchField")
		if err := c.create(t, pm, true); err == nil || !strings.Contains(err.Error(), "noSuchField") {
			t.Errorf("a PodMonitor with an unknown field passed the dry run (err %v): the CRD is not validating", err)
		}
	})

	// The chart (charts/proxyhealth), rendered with each of its test values files as helm
	// template does, in namespace proxyhealth (which overlay_dry_run created). The paths are
	// relative to test/e2e and test/deploy alike.
	t.Run("chart_dry_run", func(t *testing.T) {
		files, err := filepath.Glob("../../charts/proxyhealth/ci/*-values.yaml")
		if err != nil || len(files) == 0 {
			t.Fatalf("no chart values files: %v", err)
		}
		created := map[string]bool{ns: true}
		for _, f := range files {
			objs := decodeObjects(t, tool.Run("template", "../../charts/proxyhealth", "proxyhealth", ns, f))
			for _, o := range objs {
				if n := o.GetNamespace(); n != "" && !created[n] {
					nsObj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": n}}}
					if err := c.create(t, nsObj, false); err != nil && !apierrors.IsAlreadyExists(err) {
						t.Fatalf("creating namespace %s: %v", n, err)
					}
					created[n] = true
				}
				if err := c.create(t, o, true); err != nil {
					t.Errorf("%s: dry run of %s: %v", filepath.Base(f), describe(o), err)
				}
			}
			t.Logf("%s: %d objects accepted", filepath.Base(f), len(objs))
		}
	})

	// The chart installed, upgraded and uninstalled for real, as the helm CLI does.
	t.Run("helm_release", func(t *testing.T) { testHelmRelease(t, cp, c, tool) })

	t.Run("rbac_view_fresh", func(t *testing.T) {
		for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
			if err := c.create(t, kinds[k], false); err != nil {
				t.Fatalf("creating %s: %v", describe(kinds[k]), err)
			}
		}
		kubeconfig := cp.tokenKubeconfig(t, ns, kinds["ServiceAccount"].GetName(), kinds["ServiceAccount"].GetName()+"-"+ns+".kubeconfig", apiserverAddr)
		e := l.In(t).StartExporter("proxyhealth-deploy", deployExporterPort, nil, deployExporterArgs(kubeconfig)...)
		e.Poll(t, 30*time.Second, "the API view fresh and the rules collector succeeding", nil, func(s Scrape) (bool, string) {
			fresh, _, _ := s.Value(viewFresh, nil)
			ok, _, _ := s.Value(success, rulesCollector)
			return fresh == 1 && ok == 1, s.Series(viewFresh) + s.Series(success)
		})
	})

	// The same ClusterRole less one verb on EndpointSlices, bound to another ServiceAccount.
	// The lab's apiserver streams lists (its etcd has the watch progress requests that
	// consistent reads from the watch cache need): a streamed list is a watch with
	// sendInitialEvents, which watch alone allows, so the view syncs without list.
	t.Run("rbac_without_list_on_endpointslices", func(t *testing.T) {
		kubeconfig := accountWithoutVerb(t, cp, c, kinds, ns, "list")
		e := l.In(t).StartExporter("proxyhealth-nolist", noListPort, nil, deployExporterArgs(kubeconfig)...)
		e.Poll(t, 30*time.Second, "the API view fresh from streamed lists", nil, func(s Scrape) (bool, string) {
			fresh, _, _ := s.Value(viewFresh, nil)
			ok, _, _ := s.Value(success, rulesCollector)
			return fresh == 1 && ok == 1, s.Series(viewFresh) + s.Series(success)
		})
	})
	// Against a server that does not stream, the view lists in pages: without list it never
	// syncs. client-go's WatchListClient off stands for such a server.
	t.Run("rbac_without_list_on_endpointslices_paged", func(t *testing.T) {
		kubeconfig := accountWithoutVerb(t, cp, c, kinds, ns, "list")
		e := l.In(t).StartExporter("proxyhealth-nolist-paged", noListPagedPort, []string{"env", "KUBE_FEATURE_WatchListClient=false"}, deployExporterArgs(kubeconfig)...)
		waitFor(t, 10*time.Second, "the forbidden list in the exporter's log", func() (bool, string) {
			log, _ := os.ReadFile(e.p.log)
			return strings.Contains(string(log), `cannot list resource \"endpointslices\"`), string(log)
		})
		// Several times the fresh-within window: the view never becomes fresh.
		deadline := time.Now().Add(4 * apiFreshWithin)
		for time.Now().Before(deadline) {
			s := e.Scrape(t)
			if v, ok, _ := s.Value(viewFresh, nil); !ok || v != 0 {
				t.Fatalf("without list on endpointslices: %s", s.Series(viewFresh))
			}
			if v, ok, _ := s.Value(success, rulesCollector); !ok || v != 0 {
				t.Fatalf("without list on endpointslices the rules collector: %s", s.Series(success))
			}
			time.Sleep(scrapeEvery)
		}
	})
	t.Run("rbac_without_watch_on_endpointslices", func(t *testing.T) {
		kubeconfig := accountWithoutVerb(t, cp, c, kinds, ns, "watch")
		e := l.In(t).StartExporter("proxyhealth-nowatch", noWatchPort, nil, deployExporterArgs(kubeconfig)...)
		waitFor(t, 10*time.Second, "the forbidden watch in the exporter's log", func() (bool, string) {
			log, _ := os.ReadFile(e.p.log)
			return strings.Contains(string(log), `cannot watch resource \"endpointslices\"`), string(log)
		})
		var fresh []string
		deadline := time.Now().Add(4 * apiFreshWithin)
		for time.Now().Before(deadline) {
			v, _, _ := e.Scrape(t).Value(viewFresh, nil)
			fresh = append(fresh, fmt.Sprint(v))
			time.Sleep(scrapeEvery)
		}
		// The reflector's re-lists succeed between failed watches, but then the EndpointSlices
		// follow the API only at each re-list (client-go's backoff, up to 30 s), not per event:
		// a view whose watches fail is not fresh.
		if slices.Contains(fresh, "1") {
			t.Errorf("without watch on endpointslices the view reported fresh: %s over %s", strings.Join(fresh, " "), 4*apiFreshWithin)
		}
	})
}

// accountWithoutVerb creates a copy of the overlay's ClusterRole without verb on
// endpointslices, bound to a new ServiceAccount (both kept when they exist), and returns a
// kubeconfig with that account's token.
func accountWithoutVerb(t *testing.T, cp *ControlPlane, c *deployClients, kinds map[string]*unstructured.Unstructured, ns, verb string) string {
	t.Helper()
	name := "proxyhealth-no" + verb
	role := kinds["ClusterRole"].DeepCopy()
	role.SetName(name)
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	removed := false
	for _, r := range rules {
		m := r.(map[string]any)
		if slices.Contains(toStrings(m["resources"]), "endpointslices") {
			var verbs []any
			for _, v := range toStrings(m["verbs"]) {
				if v == verb {
					removed = true
					continue
				}
				verbs = append(verbs, v)
			}
			m["verbs"] = verbs
		}
	}
	if !removed {
		t.Fatalf("the ClusterRole has no %s on endpointslices to remove", verb)
	}
	_ = unstructured.SetNestedSlice(role.Object, rules, "rules")
	sa := kinds["ServiceAccount"].DeepCopy()
	sa.SetName(name)
	binding := kinds["ClusterRoleBinding"].DeepCopy()
	binding.SetName(name)
	_ = unstructured.SetNestedField(binding.Object, name, "roleRef", "name")
	_ = unstructured.SetNestedSlice(binding.Object, []any{map[string]any{"kind": "ServiceAccount", "name": name, "namespace": ns}}, "subjects")
	for _, o := range []*unstructured.Unstructured{sa, role, binding} {
		if err := c.create(t, o, false); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating %s: %v", describe(o), err)
		}
	}
	return cp.tokenKubeconfig(t, ns, name, name+"-"+ns+".kubeconfig", apiserverAddr)
}

func deployExporterArgs(kubeconfig string) []string {
	return []string{
		"--log.level=info",
		"--kubeconfig=" + kubeconfig,
		"--node-name=" + labNodeName,
		"--rules.check-interval=1s",
		"--api.fresh-within=" + apiFreshWithin.String(),
		"--api.probe-interval=" + apiProbeInterval.String(),
	}
}

func toStrings(v any) []string {
	var out []string
	if s, ok := v.([]any); ok {
		for _, e := range s {
			out = append(out, fmt.Sprint(e))
		}
	}
	return out
}
