// Package nftnltest loads captured kube-proxy rulesets into the kernel for tests that run in a
// network namespace of their own (never the machine's root namespace): iptables-save text
// through iptables-nft-restore, and `nft -j list` JSON through `nft -j -f`.
package nftnltest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// NetnsEnv is set in the environment of a test binary that ReexecInNetns re-ran inside a new
// network namespace.
const NetnsEnv = "PROXYHEALTH_TEST_NETNS"

// ReexecInNetns re-runs the test binary under `unshare --net` when it runs as root outside
// such a namespace, and exits with its status; otherwise it returns and the caller runs the
// tests (kernel tests then skip, or fail under CI: see InNetns and internal/testsupport/prereq).
func ReexecInNetns() {
	if os.Getenv(NetnsEnv) != "" || os.Geteuid() != 0 {
		return
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return
	}
	cmd := exec.Command(unshare, append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), NetnsEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			os.Exit(ee.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "unshare:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// InNetns reports whether this process runs in a network namespace a test created.
func InNetns() bool { return os.Getenv(NetnsEnv) == "1" }

// T is the part of testing.TB the loaders use.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

func run(t T, stdin []byte, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// Flush removes every nf_tables table of the namespace (iptables-nft's included).
func Flush(t T) {
	t.Helper()
	run(t, nil, "nft", "flush", "ruleset")
}

var nfacctName = regexp.MustCompile(`--nfacct-name +(\S+)`)

// LoadIPTablesSave loads iptables-save text with iptables-nft-restore (ip6tables-nft-restore
// with ipv6), passing it restoreArgs (e.g. "--noflush" to add to what is loaded). The nfacct objects its `-m nfacct` matches name are created first, as kube-proxy
// does: the kernel refuses a rule naming one that does not exist.
func LoadIPTablesSave(t T, text []byte, ipv6 bool, restoreArgs ...string) {
	t.Helper()
	bin := "iptables-nft-restore"
	if ipv6 {
		bin = "ip6tables-nft-restore"
	}
	if _, err := exec.LookPath(bin); err != nil {
		prereq.Skipf(t, "%s not installed", bin)
	}
	for _, m := range nfacctName.FindAllSubmatch(text, -1) {
		if err := addNFAcct(string(m[1])); err != nil {
			t.Fatalf("create nfacct object %s: %v", m[1], err)
		}
	}
	run(t, text, bin, restoreArgs...)
}

// addNFAcct creates a named nfacct counter (NFNL_SUBSYS_ACCT, NFNL_MSG_ACCT_NEW); an existing
// one is fine.
func addNFAcct(name string) error {
	const (
		nfnlSubsysAcct = 7
		nfnlMsgAcctNew = 0
		nfacctName     = 1
	)
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: nfacctName, Data: append([]byte(name), 0)}})
	if err != nil {
		return err
	}
	_, err = c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(nfnlSubsysAcct<<8 | nfnlMsgAcctNew),
			Flags: netlink.Request | netlink.Acknowledge | netlink.Create,
		},
		Data: append([]byte{unix.AF_UNSPEC, 0, 0, 0}, attrs...),
	})
	// An object of that name left by an earlier load answers EBUSY (or EEXIST): reuse it.
	if err != nil && !os.IsExist(err) && !errors.Is(err, unix.EBUSY) {
		return err
	}
	return nil
}

// LoadNFTJSON loads `nft -j list ...` output with `nft -j -f`. nft lists a table's sets and
// maps before its chains, but a map whose elements `goto` a chain can only be added once the
// chain exists, so objects are reordered: tables, chains, sets and maps, then rules.
func LoadNFTJSON(t T, doc []byte) {
	t.Helper()
	var d struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatalf("nft JSON: %v", err)
	}
	rank := map[string]int{"metainfo": 0, "table": 1, "chain": 2, "set": 3, "map": 3, "rule": 4}
	slices.SortStableFunc(d.Nftables, func(a, b map[string]json.RawMessage) int {
		return rank[kind(a)] - rank[kind(b)]
	})
	out, err := json.Marshal(d)
	if err != nil {
		t.Fatalf("nft JSON: %v", err)
	}
	run(t, out, "nft", "-j", "-f", "-")
}

func kind(o map[string]json.RawMessage) string {
	for k := range o {
		return k
	}
	return ""
}

// LoadNFT loads an nft script with `nft -f`.
func LoadNFT(t T, script []byte) {
	t.Helper()
	run(t, script, "nft", "-f", "-")
}
