package cluster

import (
	"log/slog"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/logbuf"
)

// client-go's klog output goes to the logger of the Cluster that ran last, with klog's own
// attributes, while another goroutine logs through klog (the race detector watches).
func TestRouteKlogFollowsTheLastCluster(t *testing.T) {
	var first, second logbuf.Buffer
	routeKlog(slog.New(slog.NewTextHandler(&first, nil)).With("component", "client-go"))
	klog.InfoS("to the first", "resource", "services")

	// A reflector of the first Cluster logs on while the second one starts.
	started, stop := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 100_000 {
			klog.V(4).InfoS("a reflector winding down")
			if i == 0 {
				close(started)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	})
	<-started
	routeKlog(slog.New(slog.NewTextHandler(&second, nil)).With("cluster", 2))
	close(stop)
	wg.Wait()
	klog.LoggerWithValues(klog.Background(), "reflector", "nodes").Info("to the second")

	if got := first.String(); !strings.Contains(got, `msg="to the first" component=client-go resource=services`) || strings.Contains(got, "to the second") {
		t.Errorf("first logger got:\n%s", got)
	}
	if got := second.String(); !strings.Contains(got, `msg="to the second" cluster=2 reflector=nodes`) || strings.Contains(got, "to the first") {
		t.Errorf("second logger got:\n%s", got)
	}
}
