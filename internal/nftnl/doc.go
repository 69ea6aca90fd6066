// Package nftnl reads the nf_tables state that decides proxyhealth's checks in process, over
// netfilter netlink, instead of running iptables-nft-save or nft and parsing their text:
//
//   - kube-proxy's iptables mode written through iptables-nft (table ip/ip6 nat:
//     KUBE-SERVICES, KUBE-SVC-*, KUBE-SVL-*, KUBE-SEP-*), ReadIPTablesNAT;
//   - kube-proxy's nftables mode (table ip/ip6 kube-proxy), ReadKubeProxyNFT;
//   - the forward path's rules for the conntrack INVALID drop check, in iptables-nft's filter
//     tables and in every native table with a forward base chain, ForwardReader;
//   - the ruleset generation and a watch on the nftables multicast group, so a caller re-reads
//     only when a commit touched the tables it cares about, and only the chains and sets it
//     touched (Generation, Watch);
//   - kube-proxy's tables kept up to date from the watch's changes, re-reading only the
//     chains and sets each names (Follower).
//
// Results come in the types of internal/ruleset, so callers do not see netlink.
//
// Dumps are streamed: each message is decoded as it arrives and only what the result needs is
// kept (chain names, jump targets, DNAT destinations), never a whole table's rules. That is
// why the dumps run over a socket of this package rather than github.com/google/nftables'
// Conn, whose getters (through mdlayher/netlink) collect a whole multi-part reply before
// returning: a 10,000-service nat table is about 300,000 rule messages. google/nftables still
// decodes what is inside the messages: its expr types, its xt package for the x_tables
// compatibility matches and targets iptables-nft writes (DNAT, conntrack, comment) and its
// userdata package.
package nftnl
