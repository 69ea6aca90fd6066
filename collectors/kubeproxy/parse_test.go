package kubeproxy

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// counts maps "resource/verb" to failures.
type counts map[string]int

func countFile(t *testing.T, name string, now time.Time) (counts, []time.Time) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	got := counts{}
	var times []time.Time
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if ev, ok := parseLine(sc.Bytes(), now); ok {
			got[resourceNames[ev.resource]+"/"+verbNames[ev.verb]]++
			times = append(times, ev.ts)
		}
	}
	return got, times
}

var testNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func TestParseFixtures(t *testing.T) {
	for _, tc := range []struct {
		file string
		want counts
	}{
		{
			// Real lines of kube-proxy v1.36.3 when its API connection died (the lab).
			file: "kube-proxy-v1.36.3-watch-errors.log",
			want: counts{"endpointslices/watch": 1, "services/watch": 1, "servicecidrs/watch": 1, "nodes/watch": 1},
		},
		{
			// client-go before structured logging: "Failed to list" (one line per failure);
			// "watch of ... ended with" (an expired resource version is no failure); the
			// lower-case "failed to list" warning that precedes "Failed to watch" in v0.2x is
			// not counted again; kube-proxy's own "Failed to list iptables rules" is not a
			// reflector's.
			file: "klog-text-old.log",
			want: counts{"services/list": 1, "endpoints/list": 1, "endpointslices/list": 1, "endpoints/watch": 1,
				"nodes/list": 1, "services/watch": 1},
		},
		{
			// "Unhandled Error" (v1.31-1.32), "Failed to watch" with a list or a watch inner
			// error (v1.33+), v1beta1 ServiceCIDR, an unknown kind, and "watch ended with error".
			file: "klog-text-structured.log",
			want: counts{"services/list": 1, "endpointslices/list": 1, "servicecidrs/list": 2, "nodes/watch": 1,
				"other/list": 1, "services/watch": 1},
		},
		{
			file: "klog-json.log",
			want: counts{"endpointslices/watch": 1, "services/list": 1, "nodes/list": 1},
		},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, _ := countFile(t, tc.file, testNow)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParseTimes(t *testing.T) {
	_, times := countFile(t, "kube-proxy-v1.36.3-watch-errors.log", testNow)
	if want := time.Date(2026, 11, 21, 21, 0, 47, 996689000, time.UTC); !times[0].Equal(want) {
		t.Errorf("klog header time %v, want %v", times[0], want)
	}
	// A klog header read just after New Year belongs to the year before.
	_, times = countFile(t, "kube-proxy-v1.36.3-watch-errors.log", time.Date(2027, 1, 1, 0, 5, 0, 0, time.UTC))
	if times[0].Year() != 2026 {
		t.Errorf("klog header read in January 2027 dated %v", times[0])
	}
	_, times = countFile(t, "klog-json.log", testNow)
	if want := time.UnixMilli(1763748047996).Add(689 * time.Microsecond); times[0].Sub(want).Abs() > time.Microsecond {
		t.Errorf("JSON ts read as %v, want %v", times[0], want)
	}
	// A CRI record's own time wins over the klog header.
	ev, ok := parseLine([]byte(`2026-11-21T21:00:47.123456789Z stderr F E1121 21:00:40.000000 1 reflector.go:205] "Failed to watch" err="failed to list *v1.Service: x" type="*v1.Service"`), testNow)
	if !ok || ev.resource != resServices || ev.verb != verbList || !ev.ts.Equal(time.Date(2026, 11, 21, 21, 0, 47, 123456789, time.UTC)) {
		t.Errorf("CRI line parsed as %+v, %v", ev, ok)
	}
	// No header, no time: the follower uses the time it read the line.
	ev, ok = parseLine([]byte(`k8s.io/client-go/informers/factory.go:135: Failed to list *v1.Node: x`), testNow)
	if !ok || !ev.ts.IsZero() || ev.resource != resNodes {
		t.Errorf("bare message parsed as %+v, %v", ev, ok)
	}
}

func TestResourceOf(t *testing.T) {
	for typ, want := range map[string]string{
		"*v1.Service": "services", "*v1.EndpointSlice": "endpointslices", "*v1beta1.EndpointSlice": "endpointslices",
		"*v1.Endpoints": "endpoints", "*v1.Node": "nodes", "*v1.ServiceCIDR": "servicecidrs",
		"*v1beta1.ServiceCIDR": "servicecidrs", "*v1.Pod": "other", "": "other", "*": "other",
	} {
		if got := resourceNames[resourceOf(typ)]; got != want {
			t.Errorf("resourceOf(%q) = %s, want %s", typ, got, want)
		}
	}
}

func TestSplitCRI(t *testing.T) {
	for _, tc := range []struct {
		line, msg string
		partial   bool
		ok        bool
	}{
		{"2026-11-21T21:00:47.996689000Z stderr F hello world", "hello world", false, true},
		{"2026-11-21T21:00:47.996689000+01:00 stdout P part", "part", true, true},
		{"2026-11-21T21:00:47Z stdout F", "", false, true},
		{"2026-11-21T21:00:47Z stdin F x", "", false, false},
		{"I1121 21:00:47.996689   10834 reflector.go:664] x", "", false, false},
		{"2026-11-21T21:00:47Z stdout X x", "", false, false},
	} {
		_, msg, partial, ok := splitCRI([]byte(tc.line))
		if ok != tc.ok || (ok && (string(msg) != tc.msg || partial != tc.partial)) {
			t.Errorf("splitCRI(%q) = %q, %v, %v", tc.line, msg, partial, ok)
		}
	}
}

// FuzzParseLine: no input panics, and whatever is found stays within the bounded label set.
func FuzzParseLine(f *testing.F) {
	for _, name := range []string{"kube-proxy-v1.36.3-watch-errors.log", "klog-text-old.log", "klog-text-structured.log", "klog-json.log", "cri.log"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		for _, l := range strings.Split(string(data), "\n") {
			f.Add([]byte(l))
		}
	}
	f.Add([]byte(`"Failed to watch" err=<`))
	f.Add([]byte(`{"ts":"2026-11-21T21:00:47Z","msg":"Failed to watch","err":{"x":1},"type":7}`))
	f.Add([]byte(`E0101 00:00:00.000000 1 x.go:1] "Failed to watch" err="\"`))
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, ok := parseLine(line, testNow)
		if !ok {
			return
		}
		if ev.resource < 0 || ev.resource >= numResources || ev.verb < 0 || ev.verb >= numVerbs {
			t.Fatalf("%q: out-of-range event %+v", line, ev)
		}
	})
}

func BenchmarkParseLine(b *testing.B) {
	lines := [][]byte{
		[]byte(`2026-11-21T21:00:47.996689000Z stderr F I1121 21:00:47.996689   10834 proxier.go:805] "Syncing iptables rules" ipFamily="IPv4"`),
		[]byte(`2026-11-21T21:00:47.996689000Z stderr F I1121 21:00:47.996689   10834 reflector.go:664] "Warning: watch ended with error" reflector="k8s.io/client-go@v0.36.3/tools/cache/reflector.go:343" type="*v1.Service" err="an error on the server (\"unable to decode an event from the watch stream: http2: client connection lost\") has prevented the request from succeeding"`),
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		parseLine(lines[i%2], testNow)
	}
}
