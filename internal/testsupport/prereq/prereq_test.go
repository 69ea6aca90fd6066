package prereq

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// recorder is a T that records what was asked of it.
type recorder struct{ skipped, failed string }

func (r *recorder) Helper()                        {}
func (r *recorder) Skipf(format string, a ...any)  { r.skipped = fmt.Sprintf(format, a...) }
func (r *recorder) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }

func TestSkipOrFail(t *testing.T) {
	for _, tc := range []struct {
		env, ci string
		fails   bool
	}{
		{"", "", false},
		{"0", "", false},
		{"", "false", false},
		{"1", "", true},
		{"yes", "", true},
		{"", "true", true},
		{"0", "true", true},
	} {
		t.Run(fmt.Sprintf("%s=%q CI=%q", Env, tc.env, tc.ci), func(t *testing.T) {
			t.Setenv(Env, tc.env)
			t.Setenv("CI", tc.ci)
			var r recorder
			Skipf(&r, "%s not installed", "unshare")
			if tc.fails {
				if r.skipped != "" || !strings.HasPrefix(r.failed, "unshare not installed (") || !strings.Contains(r.failed, Env) {
					t.Errorf("skipped %q, failed %q; want a failure saying what is missing and why it fails", r.skipped, r.failed)
				}
				return
			}
			if r.failed != "" || r.skipped != "unshare not installed" {
				t.Errorf("skipped %q, failed %q; want a skip saying what is missing", r.skipped, r.failed)
			}
		})
	}
	t.Setenv(Env, "1")
	var r recorder
	Skip(&r, "needs root", " and unshare(1)")
	if !strings.HasPrefix(r.failed, "needs root and unshare(1) (") {
		t.Errorf("Skip under %s: failed %q", Env, r.failed)
	}
}

// allowedSkips are the tests that skip whatever the switch says, each for a reason that is no
// missing prerequisite: keyed by file, the reason the skip gives. Every other skip goes through
// this package.
var allowedSkips = map[string][]string{
	// -short leaves out the slow tests.
	"collectors/rules/retain_test.go":                {"builds a large table"},
	"internal/buildinfo/buildinfo_test.go":           {"builds programs"},
	"internal/testsupport/iptables/iptables_test.go": {"large input"},
	// Opt-in: a recording to refresh, a scale benchmark.
	"collectors/conntrack/decode_compare_test.go": {"only with -capture"},
	"internal/nftnl/scale_kernel_test.go":         {"PROXYHEALTH_NFTNL_SCALE"},
	// What the test is about cannot be seen as root (CI runs as root).
	"collectors/kubeproxy/follow_test.go": {"root reads any file"},
	// The stored blobs are in the byte order of the machines that run the project.
	"internal/iptlegacy/decode_test.go": {"little-endian"},
	// The exporter process a test starts as a child; run alone, there is nothing to run.
	"exporter/invalidreasons_test.go": {"run by TestInvalidReasonsRestoredOnSIGTERM"},
	// A kernel built without IPVS cannot run an IPVS test whatever is installed (this machine's):
	// the kernel matrix (test/vm) runs them on kernels with ip_vs, where a missing module fails.
	"internal/ipvs/ipvstest/ipvstest.go": {"this kernel has no IPVS"},
	// A subtest that needs what an earlier one, which failed, did not produce.
	"test/e2e/drift_test.go": {"no scrape taken while drifting"},
}

var skipCall = regexp.MustCompile(`\.Skip(f|Now)?\(`)

// Every skip in the tree goes through Skip or Skipf, or is on the short list above.
func TestEverySkipIsRequiredUnderCI(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]int{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if !strings.HasSuffix(rel, ".go") || strings.HasPrefix(rel, "internal/testsupport/prereq/") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if !skipCall.MatchString(line) || strings.Contains(line, "prereq.Skip") || strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			allowed := false
			for i, reason := range allowedSkips[rel] {
				if strings.Contains(line, reason) {
					allowed = true
					used[fmt.Sprint(rel, i)]++
				}
			}
			if !allowed {
				t.Errorf("%s:%d: %s\n\tskips whatever %s says: use prereq.Skip, or add it to allowedSkips with why", rel, n, strings.TrimSpace(line), Env)
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	for file, reasons := range allowedSkips {
		for i, reason := range reasons {
			if used[fmt.Sprint(file, i)] == 0 {
				t.Errorf("allowedSkips: no skip in %s says %q any more", file, reason)
			}
		}
	}
}
