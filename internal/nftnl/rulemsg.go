package nftnl

import (
	"errors"

	"golang.org/x/sys/unix"
)

// ruleMsg is one NFT_MSG_NEWRULE message, its byte fields still views into the receive
// buffer: valid only while the message is being handled.
type ruleMsg struct {
	table, chain []byte
	handle       uint64
	userdata     []byte
	exprs        []byte // NFTA_RULE_EXPRESSIONS: a list of NFTA_LIST_ELEM
	// body is the message from its expressions on: what the rule does, without the table,
	// chain, handle and position that come before (the kernel's order). nil when another
	// attribute than the expressions, user data or compat info follows them.
	body []byte
}

var errMalformed = errors.New("malformed nf_tables message")

func parseRule(b []byte) (ruleMsg, error) {
	var r ruleMsg
	a := newAttrs(b)
	bodyOK := true
	for {
		rest := a.b
		if !a.next() {
			break
		}
		switch a.typ {
		case unix.NFTA_RULE_EXPRESSIONS, unix.NFTA_RULE_USERDATA, unix.NFTA_RULE_COMPAT:
			if r.body == nil {
				r.body = rest
			}
		default:
			bodyOK = bodyOK && r.body == nil
		}
		switch a.typ {
		case unix.NFTA_RULE_TABLE:
			r.table = a.str()
		case unix.NFTA_RULE_CHAIN:
			r.chain = a.str()
		case unix.NFTA_RULE_HANDLE:
			r.handle, _ = a.u64()
		case unix.NFTA_RULE_USERDATA:
			r.userdata = a.val
		case unix.NFTA_RULE_EXPRESSIONS:
			r.exprs = a.val
		}
	}
	if a.bad {
		return r, errMalformed
	}
	if !bodyOK {
		r.body = nil
	}
	return r, nil
}

// eachExpr calls fn with every expression's name (NFTA_EXPR_NAME) and data (NFTA_EXPR_DATA).
func eachExpr(list []byte, fn func(name, data []byte)) error {
	l := newAttrs(list)
	for l.next() {
		if l.typ != unix.NFTA_LIST_ELEM {
			continue
		}
		var name, data []byte
		e := newAttrs(l.val)
		for e.next() {
			switch e.typ {
			case unix.NFTA_EXPR_NAME:
				name = e.str()
			case unix.NFTA_EXPR_DATA:
				data = e.val
			}
		}
		if e.bad {
			return errMalformed
		}
		fn(name, data)
	}
	if l.bad {
		return errMalformed
	}
	return nil
}

// ruleComment returns the comment iptables-nft and nft keep in a rule's user data: a list of
// type (1 byte), length (1 byte), value records, the comment being type 0
// (NFTNL_UDATA_RULE_COMMENT) with a NUL-terminated value. google/nftables' userdata.Get
// indexes before it checks the length, so a truncated record would panic there.
func ruleComment(udata []byte) ([]byte, bool) {
	for len(udata) >= 2 {
		typ, l := udata[0], int(udata[1])
		if len(udata) < 2+l {
			return nil, false
		}
		if typ == 0 {
			return cstr(udata[2 : 2+l]), true
		}
		udata = udata[2+l:]
	}
	return nil, false
}
