package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/proxyhealth/proxyhealth/internal/nodereport"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// fakeAPIServer answers the plugin's two lists in namespace monitoring, ConfigMaps and Pods, by
// label selector and a page at a time (limit and continue), as the API server does; every other
// request is 404, so a plugin that asks for more (a proxy, a token) fails.
type fakeAPIServer struct {
	srv *httptest.Server
	// released ends the lists that never answer, when the test is over.
	released chan struct{}

	mu         sync.Mutex
	configMaps []corev1.ConfigMap
	pods       []corev1.Pod
	// listNeverAnswers: the server takes the lists but answers none.
	listNeverAnswers bool
	// rawReports, when set, is the body answered to the ConfigMap list.
	rawReports []byte
	paths      []string // every request's method and path
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	a := &fakeAPIServer{released: make(chan struct{})}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.paths = append(a.paths, r.Method+" "+r.URL.Path)
		hang, raw := a.listNeverAnswers, a.rawReports
		cms, pods := append([]corev1.ConfigMap(nil), a.configMaps...), append([]corev1.Pod(nil), a.pods...)
		a.mu.Unlock()
		if r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		if hang {
			select {
			case <-r.Context().Done():
			case <-a.released:
			}
			return
		}
		sel, err := labels.Parse(r.URL.Query().Get("labelSelector"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		from, _ := strconv.Atoi(r.URL.Query().Get("continue"))
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/namespaces/monitoring/configmaps":
			if raw != nil {
				_, _ = w.Write(raw)
				return
			}
			var items []corev1.ConfigMap
			for _, cm := range cms {
				if sel.Matches(labels.Set(cm.Labels)) {
					items = append(items, cm)
				}
			}
			page, next := paginate(len(items), from, limit)
			_ = json.NewEncoder(w).Encode(corev1.ConfigMapList{TypeMeta: metav1.TypeMeta{Kind: "ConfigMapList", APIVersion: "v1"},
				ListMeta: metav1.ListMeta{Continue: next}, Items: items[page[0]:page[1]]})
		case "/api/v1/namespaces/monitoring/pods":
			var items []corev1.Pod
			for _, p := range pods {
				if sel.Matches(labels.Set(p.Labels)) {
					items = append(items, p)
				}
			}
			page, next := paginate(len(items), from, limit)
			_ = json.NewEncoder(w).Encode(corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
				ListMeta: metav1.ListMeta{Continue: next}, Items: items[page[0]:page[1]]})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(a.srv.Close)
	// Before the server's close, which waits for its handlers.
	t.Cleanup(func() { close(a.released) })
	return a
}

// paginate is the page [from, from+limit) of n items, and the continue token of the next.
func paginate(n, from, limit int) ([2]int, string) {
	if limit <= 0 {
		limit = n
	}
	from = min(from, n)
	end := min(from+limit, n)
	next := ""
	if end < n {
		next = strconv.Itoa(end)
	}
	return [2]int{from, end}, next
}

func (a *fakeAPIServer) set(change func(*fakeAPIServer)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	change(a)
}

// addNode adds node's exporter pod, Running, and its report with body (none when nil).
func (a *fakeAPIServer) addNode(t *testing.T, node string, body []byte) {
	t.Helper()
	p := pod("proxyhealth-"+node, node, corev1.PodRunning)
	p.Labels = map[string]string{"app.kubernetes.io/name": "proxyhealth"}
	a.set(func(a *fakeAPIServer) {
		a.pods = append(a.pods, p)
		if body != nil {
			a.configMaps = append(a.configMaps, *reportObject(node, body))
		}
	})
}

// reportObject is node's report ConfigMap in monitoring, as its exporter writes it.
func reportObject(node string, body []byte) *corev1.ConfigMap {
	return nodereport.Object("monitoring", body, node, "uid-"+"node", 5*time.Minute)
}

func (a *fakeAPIServer) run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), append([]string{"--server=" + a.srv.URL, "-n", "monitoring"}, args...), &out, &errOut)
	return out.String(), errOut.String(), code
}

// freshBody is a healthy report of node judged now.
func freshBody(t *testing.T, node string, v verdict.Verdict, findings ...verdict.Finding) []byte {
	t.Helper()
	if findings == nil {
		findings = []verdict.Finding{}
	}
	b, err := json.Marshal(verdict.Report{Node: node, Verdict: v, Time: time.Now().UTC(), Findings: findings, NotChecked: []verdict.NotChecked{}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
