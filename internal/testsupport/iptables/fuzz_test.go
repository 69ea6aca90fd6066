package iptables

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse checks that no input makes the parser or the analyses on its result panic, and that
// every rule's arguments can be read back.
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	for _, s := range []string{
		"",
		"*filter\nCOMMIT\n",
		"*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n",
		"*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m comment --comment \"a \\\" b\\\\\" -j\nCOMMIT\n",
		"*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD ! ! -m -j -g\nCOMMIT\n",
		"*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 1.2.3.4 -p tcp --dport 1 -j KUBE-SVC-X\nCOMMIT\n",
		"*filter\n:A - [0:0]\n[1:2] -A A -j A\n-A A -m state --state INVALID -g A\nCOMMIT\n",
		"*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m comment --comment \"\\\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		rs, err := ParseString(in)
		if err != nil {
			if rs != nil {
				t.Fatal("ruleset returned with an error")
			}
			return
		}
		KubeServices(rs)
		for _, tb := range rs.Tables {
			for _, c := range tb.Chains {
				rs.InvalidDropReachable(tb.Name, c.Name)
				for i := range c.Rules {
					r := &c.Rules[i]
					_ = r.Args()
					r.Target()
					r.Goto()
					r.Comment()
					r.Unconditional()
					for o := range r.Options() {
						o.Value()
						o.Values()
					}
					for range r.Modules() {
					}
				}
			}
		}
	})
}
