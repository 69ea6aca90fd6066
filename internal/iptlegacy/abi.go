package iptlegacy

// The kernel ABI this package decodes, from include/uapi/linux/netfilter/x_tables.h,
// netfilter_ipv4/ip_tables.h and netfilter_ipv6/ip6_tables.h, as laid out for 64-bit userspace
// (struct xt_counters holds u64s, so entries and XT_ALIGN are 8-byte aligned).

// Socket options, on level SOL_IP (IPv4) or SOL_IPV6 (IPv6): IPT_BASE_CTL is 64 and the IPv6
// options have the same numbers.
const (
	soGetInfo    = 64 // IPT_SO_GET_INFO, IP6T_SO_GET_INFO
	soGetEntries = 65 // IPT_SO_GET_ENTRIES, IP6T_SO_GET_ENTRIES
)

// Netfilter hooks (enum nf_inet_hooks) and the builtin chain each one enters.
const numHooks = 5

var hookChain = [numHooks]string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}

const (
	tableNameLen = 32 // XT_TABLE_MAXNAMELEN

	// struct ipt_getinfo / ip6t_getinfo: name, valid_hooks, hook_entry[5], underflow[5],
	// num_entries, size.
	getInfoSize = tableNameLen + 4 + 4*numHooks + 4*numHooks + 4 + 4

	// struct ipt_get_entries / ip6t_get_entries: name, size, then the entries, which start
	// 8-byte aligned.
	getEntriesHeader = 40

	// struct xt_entry_match and xt_entry_target start with a 32-byte header: u16 size, the
	// extension's name (29 bytes, NUL-terminated) and its revision.
	extHeader  = 32
	extNameLen = 29

	// xt_standard_target: header and an int verdict.
	standardTargetMin = extHeader + 4
	// xt_error_target: header and errorname[XT_FUNCTION_MAXNAMELEN].
	errorNameLen = 30
)

// Standard target verdicts: a negative verdict is -(NF_* verdict)-1, a non-negative one is the
// offset of the rule to jump to.
const (
	verdictDrop   = -1 // -NF_DROP - 1
	verdictAccept = -2 // -NF_ACCEPT - 1
	verdictQueue  = -4 // -NF_QUEUE - 1
	verdictReturn = -5 // XT_RETURN = -NF_REPEAT - 1
)

// entryLayout is where struct ipt_entry and ip6t_entry keep the fields this package reads.
type entryLayout struct {
	ipv6 bool
	size int // sizeof(struct ipt_entry): where the first match starts

	src, dst, smsk, dmsk int // addresses and masks, addrLen bytes each
	addrLen              int
	iniface, outiface    int // char[IFNAMSIZ]
	inmask, outmask      int // unsigned char[IFNAMSIZ]
	proto                int // u16
	flags, invflags      int // u8
	targetOffset         int // u16: where the target starts, from the entry's start
	nextOffset           int // u16: the entry's size, matches and target included

	flagGoto  uint8 // IPT_F_GOTO / IP6T_F_GOTO in flags
	flagProto uint8 // IP6T_F_PROTO: IPv6 marks a set protocol in flags; 0 for IPv4
}

const ifNameLen = 16 // IFNAMSIZ

var (
	// struct ipt_entry { struct ipt_ip ip; unsigned int nfcache; __u16 target_offset;
	// __u16 next_offset; unsigned int comefrom; struct xt_counters counters; elems[] }
	// with struct ipt_ip { in_addr src, dst, smsk, dmsk; char iniface[16], outiface[16];
	// unsigned char iniface_mask[16], outiface_mask[16]; __u16 proto; __u8 flags, invflags; }
	layout4 = entryLayout{
		size: 112,
		src:  0, dst: 4, smsk: 8, dmsk: 12, addrLen: 4,
		iniface: 16, outiface: 32, inmask: 48, outmask: 64,
		proto: 80, flags: 82, invflags: 83,
		targetOffset: 88, nextOffset: 90,
		flagGoto: 0x02, // IPT_F_GOTO
	}
	// struct ip6t_entry { struct ip6t_ip6 ipv6; ... } with struct ip6t_ip6 { in6_addr src,
	// dst, smsk, dmsk; char iniface[16], outiface[16]; unsigned char iniface_mask[16],
	// outiface_mask[16]; __u16 proto; __u8 tos, flags, invflags; } (136 bytes with padding),
	// then nfcache at 136, the offsets at 140 and 142, comefrom at 144 and the counters 8-byte
	// aligned at 152.
	layout6 = entryLayout{
		ipv6: true,
		size: 168,
		src:  0, dst: 16, smsk: 32, dmsk: 48, addrLen: 16,
		iniface: 64, outiface: 80, inmask: 96, outmask: 112,
		proto: 128, flags: 131, invflags: 132,
		targetOffset: 140, nextOffset: 142,
		flagGoto:  0x04, // IP6T_F_GOTO
		flagProto: 0x01, // IP6T_F_PROTO
	}
)

func layoutFor(ipv6 bool) *entryLayout {
	if ipv6 {
		return &layout6
	}
	return &layout4
}

// ipt_ip.flags IPT_F_FRAG (-f); IPv6 keeps IP6T_F_TOS (0x02) there instead, and both count as a
// restriction below.
const (
	flagFrag4 = 0x01
	flagTOS6  = 0x02
)
