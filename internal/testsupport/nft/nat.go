package nft

import (
	"encoding/json"
	"net/netip"
)

// DNATTargets returns the destinations the rule's dnat statements translate to, in the order
// listed, in the two forms kube-proxy's nftables mode writes (pkg/proxy/nftables/proxier.go):
//
//   - `dnat to 10.244.1.3:8080` (its per-endpoint chains, used with ClientIP session affinity,
//     and since v1.37 a service chain with one endpoint):
//     {"dnat": {"addr": "10.244.1.3", "port": 8080}}
//   - `dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.3.3 . 8080, 1 : ... }`
//     (endpoints inline): {"dnat": {"family": "ip", "addr": {"map": {"key": {"numgen": ...},
//     "data": {"set": [[0, {"concat": ["10.244.3.3", 8080]}], ...]}}}}}
//
// Forms it cannot resolve to an address and port (a named map, an address without a port, a
// range) are left out. Addresses are unmapped (an IPv4-mapped IPv6 address reads as IPv4).
func (r *Rule) DNATTargets() []netip.AddrPort {
	var out []netip.AddrPort
	for _, e := range r.Expr {
		var st struct {
			DNAT *struct {
				Addr json.RawMessage `json:"addr"`
				Port json.RawMessage `json:"port"`
			} `json:"dnat"`
		}
		if json.Unmarshal(e, &st) != nil || st.DNAT == nil {
			continue
		}
		if addr, ok := parseAddr(st.DNAT.Addr); ok {
			if port, ok := parsePort(st.DNAT.Port); ok {
				out = append(out, netip.AddrPortFrom(addr, port))
			}
			continue
		}
		var m struct {
			Map *struct {
				Data json.RawMessage `json:"data"`
			} `json:"map"`
		}
		if json.Unmarshal(st.DNAT.Addr, &m) != nil || m.Map == nil {
			continue
		}
		for _, v := range mapValues(m.Map.Data) {
			var c struct {
				Concat []json.RawMessage `json:"concat"`
			}
			if json.Unmarshal(v, &c) != nil || len(c.Concat) != 2 {
				continue
			}
			addr, ok := parseAddr(c.Concat[0])
			port, ok2 := parsePort(c.Concat[1])
			if ok && ok2 {
				out = append(out, netip.AddrPortFrom(addr, port))
			}
		}
	}
	return out
}

// JumpTargets returns the chains the rule's jump and goto verdicts name, in the order listed:
// plain verdicts (`goto endpoint-...`) and those in an anonymous verdict map
// (`numgen random mod 2 vmap { 0 : goto endpoint-..., 1 : goto endpoint-... }`).
func (r *Rule) JumpTargets() []string {
	var out []string
	for _, e := range r.Expr {
		var st map[string]json.RawMessage
		if json.Unmarshal(e, &st) != nil {
			continue
		}
		for kind, body := range st {
			switch kind {
			case "jump", "goto":
				if t := verdictTarget(body); t != "" {
					out = append(out, t)
				}
			case "vmap":
				var m struct {
					Data json.RawMessage `json:"data"`
				}
				if json.Unmarshal(body, &m) != nil {
					continue
				}
				for _, v := range mapValues(m.Data) {
					var verdict map[string]json.RawMessage
					if json.Unmarshal(v, &verdict) != nil {
						continue
					}
					for vk, vb := range verdict {
						if vk == "jump" || vk == "goto" {
							if t := verdictTarget(vb); t != "" {
								out = append(out, t)
							}
						}
					}
				}
			}
		}
	}
	return out
}

// mapValues returns the values of an anonymous map's elements: data is {"set": [[key, value],
// ...]}. A named map ("@name") has none here.
func mapValues(data json.RawMessage) []json.RawMessage {
	var s struct {
		Set []json.RawMessage `json:"set"`
	}
	if json.Unmarshal(data, &s) != nil {
		return nil
	}
	out := make([]json.RawMessage, 0, len(s.Set))
	for _, elem := range s.Set {
		var pair []json.RawMessage
		if json.Unmarshal(elem, &pair) != nil || len(pair) != 2 {
			continue
		}
		out = append(out, pair[1])
	}
	return out
}

func parseAddr(raw json.RawMessage) (netip.Addr, bool) {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func parsePort(raw json.RawMessage) (uint16, bool) {
	var n json.Number
	if json.Unmarshal(raw, &n) != nil {
		return 0, false
	}
	p, err := n.Int64()
	if err != nil || p < 0 || p > 65535 {
		return 0, false
	}
	return uint16(p), true
}
