package proxyversion

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Version
		ok   bool
	}{
		{"v1.37.2", Version{1, 37}, true},
		{"v1.34.4+k3s1", Version{1, 34}, true},
		{"v1.36.3-eks-1234567", Version{1, 36}, true},
		{"v1.38.0-alpha.1", Version{1, 38}, true},
		{"1.33.0", Version{1, 33}, true},
		{"v1.37", Version{1, 37}, true},
		{"v2.0.0", Version{2, 0}, true},
		// A build without version information (the lab's binaries built from the module).
		{"v0.0.0-master+$Format:%H$", Version{}, false},
		{"", Version{}, false},
		{"v1", Version{}, false},
		{"v1.37x", Version{}, false},
		{"master", Version{}, false},
		{"v1.99999.0", Version{}, false},
		{"v1.0100", Version{}, false}, // no leading zeros
	} {
		got, ok := Parse(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("Parse(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestTested(t *testing.T) {
	for _, c := range []struct {
		v    Version
		want bool
	}{
		{Version{1, 33}, false},
		{Version{1, 34}, true},
		{Version{1, 36}, true},
		{Version{1, 37}, true},
		{Version{1, 38}, false},
		{Version{2, 0}, false},
		{Version{0, 9}, false},
		{Version{}, false},
	} {
		if got := c.v.Tested(); got != c.want {
			t.Errorf("%v.Tested() = %v, want %v", c.v, got, c.want)
		}
	}
	if got := TestedRange(); got != "v1.34 to v1.37" {
		t.Errorf("TestedRange() = %q", got)
	}
}

func TestBefore(t *testing.T) {
	if !(Version{1, 35}).Before(Version{1, 36}) || (Version{1, 36}).Before(Version{1, 36}) || (Version{2, 0}).Before(Version{1, 36}) {
		t.Error("Before does not order by major, then minor")
	}
	if (Version{}).Before(Version{1, 36}) {
		t.Error("the unknown version is before none: it takes the newest behaviour")
	}
}

// FuzzParse: any text parses or not without panicking, a parsed version is known, and its
// String names the major and minor read from the text's start.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"v1.37.2", "v0.0.0-master+$Format:%H$", "v1.34.4+k3s1", "1.2", "v1..2", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := Parse(s)
		if !ok {
			if v.Known() {
				t.Fatalf("Parse(%q) failed with a known version %v", s, v)
			}
			return
		}
		if !v.Known() {
			t.Fatalf("Parse(%q) succeeded with the unknown version", s)
		}
		if !strings.HasPrefix(strings.TrimPrefix(s, "v"), strings.TrimPrefix(v.String(), "v")) {
			t.Fatalf("Parse(%q) = %v", s, v)
		}
	})
}
