package capability

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

func TestSetNames(t *testing.T) {
	s, err := Parse("NET_ADMIN, cap_net_raw,Dac_Read_Search")
	if err != nil {
		t.Fatal(err)
	}
	if s != NetAdmin|NetRaw|DACReadSearch {
		t.Fatalf("Parse: %#x", uint64(s))
	}
	if got := s.String(); got != "cap_dac_read_search,cap_net_admin,cap_net_raw" {
		t.Fatalf("String: %q", got)
	}
	if got := s.Names(); !slices.Equal(got, []string{"DAC_READ_SEARCH", "NET_ADMIN", "NET_RAW"}) {
		t.Fatalf("Names: %q", got)
	}
	if s.Count() != 3 || Set(0).String() != "" || Set(1<<63).String() != "cap_63" {
		t.Fatal("Count or String of edge sets")
	}
	if _, err := Parse("net_admin,net_magic"); err == nil || !strings.Contains(err.Error(), "cap_net_magic") {
		t.Fatalf("want an unknown-capability error, got %v", err)
	}
	if all, err := Parse(strings.Join(names[:], ",")); err != nil || all.Count() != len(names) {
		t.Fatalf("every name: %v, %d", err, all.Count())
	}
}

// The attribute as setcap cap_dac_read_search,cap_net_admin,cap_net_raw=p writes it, read back
// from an image layer.
var setcapP = []byte("\x00\x00\x00\x02\x04\x30\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")

func TestFileEncoding(t *testing.T) {
	f, err := ParseFile("cap_net_admin,cap_net_raw,cap_dac_read_search=p")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(encodeFile(f), setcapP) {
		t.Fatalf("encode: % x, want % x", encodeFile(f), setcapP)
	}
	got, err := decodeFile(setcapP)
	if err != nil || got != f {
		t.Fatalf("decode: %+v %v, want %+v", got, err, f)
	}
	if f.String() != "cap_dac_read_search,cap_net_admin,cap_net_raw=p" {
		t.Fatalf("String: %q", f)
	}
	ep, err := ParseFile("cap_net_admin+ep")
	if err != nil || !ep.Effective || ep.Permitted != NetAdmin || ep.String() != "cap_net_admin=ep" {
		t.Fatalf("ParseFile +ep: %+v %v", ep, err)
	}
	if b := encodeFile(ep); b[0] != 1 {
		t.Fatalf("the effective flag is not set: % x", b)
	}
	// Revision 3 (set inside a user namespace) carries the namespace's root uid.
	v3 := append([]byte("\x00\x00\x00\x03"), setcapP[4:]...)
	v3 = append(v3, 0xe8, 0x03, 0, 0)
	if got, err := decodeFile(v3); err != nil || got != f {
		t.Fatalf("revision 3: %+v %v", got, err)
	}
	for _, bad := range [][]byte{nil, setcapP[:19], []byte("\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00")} {
		if _, err := decodeFile(bad); err == nil {
			t.Errorf("decode % x: no error", bad)
		}
	}
	for _, bad := range []string{"cap_net_admin", "cap_net_admin=i", "cap_bogus=p"} {
		if _, err := ParseFile(bad); err == nil {
			t.Errorf("ParseFile(%q): no error", bad)
		}
	}
}

// TestRaiseFromFileCapabilities runs, as user 65534, a program whose file capabilities are
// NET_ADMIN, NET_RAW and DAC_READ_SEARCH in the permitted set only, with bounding sets that
// lack some of them, as a container that was not given them would: the exec succeeds and the
// program raises what it got, in every thread. With the effective bit (+ep) the same exec is
// refused.
func TestRaiseFromFileCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Skip(t, "needs root (setting file capabilities, changing user)")
	}
	for _, tool := range []string{"go", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			prereq.Skipf(t, "%s not found (setpriv: apt-get install -y util-linux)", tool)
		}
	}
	// A directory user 65534 can enter (t.TempDir's parent is root's only).
	dir, err := os.MkdirTemp("", "ph-capability-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(dir, "probe")
	// No cgo, as make build and the image.
	build := exec.Command("go", "build", "-o", prog, "./testdata/probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, out)
	}
	if err := os.Chmod(prog, 0o755); err != nil {
		t.Fatal(err)
	}
	ours := File{Permitted: NetAdmin | NetRaw | DACReadSearch}
	if err := WriteFile(prog, ours); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := ReadFile(prog); err != nil || !ok || got != ours {
		t.Fatalf("ReadFile: %v %v %v", got, ok, err)
	}

	run := func(bounding Set) (string, error) {
		sets := "-all"
		for _, n := range strings.Split(bounding.String(), ",") {
			if n != "" {
				sets += ",+" + strings.TrimPrefix(n, "cap_")
			}
		}
		cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set="+sets, prog)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, bounding := range []Set{NetAdmin | NetRaw | DACReadSearch, NetAdmin | DACReadSearch, NetRaw | DACReadSearch, DACReadSearch, 0} {
		t.Run("bounding="+bounding.String(), func(t *testing.T) {
			out, err := run(bounding)
			if err != nil {
				t.Fatalf("the exec failed: %v\n%s", err, out)
			}
			want := ours.Permitted & bounding
			if !strings.Contains(out, "before=\n") {
				t.Errorf("capabilities effective before Raise:\n%s", out)
			}
			if !strings.Contains(out, "effective="+want.String()+"\nerr=<nil>\n") {
				t.Fatalf("want effective=%s after Raise:\n%s", want, out)
			}
			threads := 0
			for _, l := range strings.Split(out, "\n") {
				if v, ok := strings.CutPrefix(l, "thread "); ok {
					threads++
					if v != fmt.Sprintf("%016x", uint64(want)) {
						t.Errorf("a thread has CapEff %s, want %016x", v, uint64(want))
					}
				}
			}
			if threads < 2 && runtime.GOMAXPROCS(0) > 1 {
				t.Logf("only %d thread seen", threads)
			}
		})
	}

	// The same file with the effective bit: a container without NET_RAW would not start.
	if err := WriteFile(prog, File{Permitted: ours.Permitted, Effective: true}); err != nil {
		t.Fatal(err)
	}
	if out, err := run(NetAdmin | DACReadSearch); err == nil || !strings.Contains(out, "Operation not permitted") {
		t.Fatalf("with +ep and NET_RAW missing: want the exec refused, got %v\n%s", err, out)
	}
}
