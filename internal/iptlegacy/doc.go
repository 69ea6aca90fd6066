// Package iptlegacy reads iptables-legacy (x_tables) tables in-process, through the kernel's
// socket options IPT_SO_GET_INFO / IPT_SO_GET_ENTRIES (IP6T_SO_* for IPv6), instead of running
// iptables-legacy-save and parsing its text. It reduces what it reads to the shapes of package
// ruleset: kube-proxy's service view of the nat table (ruleset.ProxyTable) and the filter
// table's forward path for the INVALID-drop search (ruleset.Graph).
//
// Why not the text: iptables-legacy-save of kube-proxy's nat table at 10,000 services peaks at
// about 400 MiB RSS and the exporter would then parse tens of MB of text it just had printed.
// The kernel's blob holds the same rules in fixed binary layouts; the nat decoder walks it once
// and keeps only the service chains' endpoints and the dispatch rules.
//
// The socket options never create anything, but naming a table the kernel does not have in the
// namespace makes it instantiate that table (x_tables instantiates registered table templates
// on first lookup). Every read therefore first checks <procfs>/net/ip_tables_names (or
// ip6_tables_names), and a missing table is reported as nil without asking the kernel.
//
// Reading needs CAP_NET_RAW (the raw socket the options are asked on) and CAP_NET_ADMIN (the
// options themselves); a missing capability comes back as an error naming it.
//
// The binary layouts are those of 64-bit userspace (amd64, arm64 and the other 64-bit ports);
// a 32-bit process on a 64-bit kernel gets the kernel's compat layout, which this package does
// not decode.
package iptlegacy
