package iptlegacy

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// addNFAcct creates an nfacct counter in the calling thread's namespace, as `nfacct add NAME`
// does: kube-proxy's rules name ct_state_invalid_dropped_pkts and
// localhost_nps_accepted_pkts with -m nfacct, and the kernel refuses such a rule until the
// counter exists. The nfacct tool is not installed here, so this speaks nfnetlink_acct itself.
func addNFAcct(name string) error {
	const (
		nfnlSubsysAcct = 7 // NFNL_SUBSYS_ACCT
		msgAcctNew     = 0 // NFNL_MSG_ACCT_NEW
		attrName       = 1 // NFACCT_NAME
	)
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	attrLen := unix.SizeofNlAttr + len(name) + 1
	msg := make([]byte, unix.NLMSG_HDRLEN+4+(attrLen+3)&^3)
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], nfnlSubsysAcct<<8|msgAcctNew)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE)
	ne.PutUint32(msg[8:], 1) // sequence
	// struct nfgenmsg: family AF_UNSPEC, version NFNETLINK_V0, res_id 0.
	a := msg[unix.NLMSG_HDRLEN+4:]
	ne.PutUint16(a[0:], uint16(attrLen))
	ne.PutUint16(a[2:], attrName)
	copy(a[unix.SizeofNlAttr:], name)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return os.NewSyscallError("sendto", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return os.NewSyscallError("recvfrom", err)
	}
	// The answer is one struct nlmsgerr: the header, then the error code (0 for success).
	if n < unix.NLMSG_HDRLEN+4 || ne.Uint16(buf[4:]) != unix.NLMSG_ERROR {
		return fmt.Errorf("nfacct add %s: unexpected answer (%d bytes)", name, n)
	}
	if code := int32(ne.Uint32(buf[unix.NLMSG_HDRLEN:])); code != 0 && unix.Errno(-code) != unix.EEXIST {
		return fmt.Errorf("nfacct add %s: %w", name, unix.Errno(-code))
	}
	return nil
}
