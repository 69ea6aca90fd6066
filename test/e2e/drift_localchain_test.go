//go:build e2e

package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// testLocalChainJumpRemoved: a NodePort Service with externalTrafficPolicy: Local has two
// endpoints on this node and one elsewhere; kube-proxy writes all three into its cluster chain
// and this node's two into its local chain. One local endpoint is then taken out of the real
// kube-proxy's local chain only, as a failed or partial restore leaves it: external traffic to
// the node can no longer reach it, though the cluster chain still holds it. The exporter's
// scrape shows exactly that service port drifting with 1 missing endpoint once the grace
// period has passed. A change of the Service's endpoints makes kube-proxy write its chains
// again, and the drift is gone.
func testLocalChainJumpRemoved(t *testing.T, cp *ControlPlane, e *Exporter, nftables bool) {
	const ns, name, portName = "lab", "web-local", "lab/web-local:http"
	here := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: labNodeName, Zone: labNodeZone} }
	there := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: "node-b", Zone: "zone-b"} }
	cp.CreateService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.57",
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30082,
				Protocol: corev1.ProtocolTCP}}},
	})
	removed, kept := podB+":8080", podB2+":8080"
	all := []string{removed, kept, "10.244.3.56:8080"}
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, []LabEndpoint{here(podB), here(podB2), there("10.244.3.56")}))

	// The chains as the real kube-proxy wrote them, and one local endpoint's jump removed.
	var chains func() (cluster, local []string)
	var removeJump func()
	if nftables {
		clusterChain := nftServiceChain("service-", ns, name, "tcp", "http")
		localChain := nftServiceChain("local-", ns, name, "tcp", "http")
		chains = func() ([]string, []string) {
			rs := cp.NFTKubeProxy()
			if rs == nil {
				return nil, nil
			}
			c, _ := NFTChainEndpoints(rs, clusterChain)
			l, _ := NFTChainEndpoints(rs, localChain)
			return c, l
		}
		// The local chain's endpoints are inline, in an anonymous numgen map: the rule is
		// replaced by one whose map lacks the endpoint, as kube-proxy would write it.
		removeJump = func() {
			rs := cp.NFTKubeProxy()
			c := rs.Table("ip", "kube-proxy").Chain(localChain)
			if c == nil || len(c.Rules) != 1 {
				t.Fatalf("%s: want one rule, the inline map, got %+v", localChain, c)
			}
			cp.Lab.MustExecInput(cp.Lab.Node, fmt.Sprintf("replace rule ip kube-proxy %s handle %d meta l4proto tcp dnat ip to numgen random mod 1 map { 0 : %s . 8080 }\n",
				localChain, c.Rules[0].Handle, podB2), "nft", "-f", "-")
		}
	} else {
		clusterChain, localChain := iptablesServiceChains(portName, "tcp")
		chains = func() ([]string, []string) {
			nat := cp.IptablesSave("nat")
			c, _ := chainEndpoints(nat, clusterChain)
			l, _ := chainEndpoints(nat, localChain)
			return c, l
		}
		// The jump to the endpoint's KUBE-SEP chain is deleted by its number in the chain.
		removeJump = func() {
			sep := iptablesEndpointChain(portName, "tcp", removed)
			n := 0
			for _, line := range strings.Split(cp.Lab.MustExec(cp.Lab.Node, "iptables", "-t", "nat", "-S", localChain), "\n") {
				if !strings.HasPrefix(line, "-A ") {
					continue
				}
				n++
				if strings.HasSuffix(line, "-j "+sep) {
					cp.Lab.MustExec(cp.Lab.Node, "iptables", "-t", "nat", "-D", localChain, strconv.Itoa(n))
					return
				}
			}
			t.Fatalf("%s has no jump to %s", localChain, sep)
		}
	}
	waitChains := func(what string, wantLocal []string) {
		waitFor(t, 30*time.Second, what, func() (bool, string) {
			c, l := chains()
			return equalStrings(c, sortedCopy(all)) && equalStrings(l, sortedCopy(wantLocal)), fmt.Sprintf("cluster chain %v, local chain %v", c, l)
		})
	}
	waitChains("lab/web-local programmed: three endpoints in its cluster chain, this node's two in its local chain", []string{removed, kept})
	waitConverged(t, e, cp, "lab/web-local checked without drift")

	sent := time.Now()
	removeJump()
	waitChains("the local chain without "+removed+", the cluster chain unchanged", []string{kept})
	missing := driftLabels(ns, name, "missing")
	s := e.Poll(t, driftGrace+2*driftCheckInterval+2*time.Second, "lab/web-local drifting with 1 missing endpoint", nil, func(s Scrape) (bool, string) {
		drifted := gauge(t, s, servicesDrifted, nil)
		if drifted != 0 && time.Since(sent) < driftGrace {
			t.Errorf("drift reported %s after the jump was removed, before the %s grace period:\n%s",
				time.Since(sent).Round(time.Millisecond), driftGrace, driftSummary(s))
		}
		return drifted == 1 && gauge(t, s, serviceDrift, missing) == 1, driftSummary(s)
	})
	t.Logf("drift reported %s after the jump was removed", time.Since(sent).Round(time.Millisecond))
	checkValue(t, s, servicesDrifted, nil, 1)
	checkValue(t, s, endpointsMissing, nil, 1)
	checkValue(t, s, endpointsStale, nil, 0)
	if n := len(s[serviceDrift].GetMetric()); n != 1 {
		t.Errorf("%s has %d series, want 1 (lab/web-local missing only):\n%s", serviceDrift, n, s.Series(serviceDrift))
	}

	// kube-proxy writes a Service's chains again when its endpoints change.
	all = append(all, "10.244.3.57:8080")
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts,
		[]LabEndpoint{here(podB), here(podB2), there("10.244.3.56"), there("10.244.3.57")}))
	waitChains("lab/web-local written again by kube-proxy", []string{removed, kept})
	e.Poll(t, 10*time.Second, "no drift once kube-proxy wrote the chains again", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, servicesDrifted, nil) == 0 && s[serviceDrift] == nil, driftSummary(s)
	})
	checkNoDrift(t, waitConverged(t, e, cp, "every service port checked after kube-proxy wrote the chains again"), "after the rewrite")
}
