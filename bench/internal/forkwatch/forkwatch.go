//go:build linux

// Package forkwatch counts the processes that process trees create, and the programs they run,
// from the kernel's process events.
package forkwatch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Watcher counts the processes that the measured process trees create, from the kernel's
// process events (the proc connector: a netlink multicast of every fork, exec and exit on the
// machine; it needs root, and this program's initial network namespace). Polling a cgroup's
// process list misses children shorter than the poll period; the events miss none, unless the
// socket overflows (counted by Lost). A group is a root process and its descendants.
type Watcher struct {
	fd   int
	stop chan struct{}
	done chan struct{}

	mu    sync.Mutex
	roots map[int]string            // root pid -> group
	tgids map[int]string            // every process of a group (roots and descendants)
	forks map[string]int            // group -> processes created since the last take
	cmds  map[string]map[string]int // group -> program -> execs since the last take
	lost  int                       // receive overflows since the start
}

// Process events ABI (linux/connector.h, linux/cn_proc.h).
const (
	cnIdxProc          = 1
	cnValProc          = 1
	procCnMcastListen  = 1
	procCnMcastIgnore  = 2
	procEventFork      = 0x1
	procEventExec      = 0x2
	procEventExit      = 0x80000000
	cnMsgHeaderLen     = 20 // cb_id{idx, val}, seq, ack, len (u16), flags (u16)
	procEventHeaderLen = 16 // what, cpu, timestamp_ns
)

// New subscribes to the process events; Close ends it.
func New() (*Watcher, error) {
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, syscall.NETLINK_CONNECTOR)
	if err != nil {
		return nil, fmt.Errorf("proc connector socket: %w", err)
	}
	// Every fork on the machine arrives here, and others may be compiling: a large buffer.
	_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, 16<<20)
	tv := syscall.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK, Groups: cnIdxProc}); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("proc connector bind: %w", err)
	}
	w := &Watcher{
		fd: fd, stop: make(chan struct{}), done: make(chan struct{}),
		roots: map[int]string{}, tgids: map[int]string{}, forks: map[string]int{}, cmds: map[string]map[string]int{},
	}
	if err := w.subscribe(procCnMcastListen); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("proc connector listen: %w", err)
	}
	go w.loop()
	return w, nil
}

func (w *Watcher) subscribe(op uint32) error {
	msg := make([]byte, syscall.NLMSG_HDRLEN+cnMsgHeaderLen+4)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], syscall.NLMSG_DONE)
	ne.PutUint32(msg[12:], uint32(os.Getpid()))
	cn := msg[syscall.NLMSG_HDRLEN:]
	ne.PutUint32(cn[0:], cnIdxProc)
	ne.PutUint32(cn[4:], cnValProc)
	ne.PutUint16(cn[16:], 4)
	ne.PutUint32(cn[cnMsgHeaderLen:], op)
	return syscall.Sendto(w.fd, msg, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK})
}

// Close stops the watch (bounded: the receive loop wakes at least every 200 ms).
func (w *Watcher) Close() {
	if w == nil {
		return
	}
	close(w.stop)
	select {
	case <-w.done:
	case <-time.After(2 * time.Second):
	}
	_ = w.subscribe(procCnMcastIgnore)
	syscall.Close(w.fd)
}

// Watch makes pid the root of group: its descendants from now on are counted.
func (w *Watcher) Watch(group string, pid int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roots[pid] = group
	w.tgids[pid] = group
}

// Take returns the processes group created since the last take and the programs they ran
// ("iptables-save 3, nft 3"), and starts counting again.
func (w *Watcher) Take(group string) (int, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, cmds := w.forks[group], w.cmds[group]
	delete(w.forks, group)
	delete(w.cmds, group)
	names := make([]string, 0, len(cmds))
	for c := range cmds {
		names = append(names, c)
	}
	sort.Slice(names, func(i, j int) bool {
		if cmds[names[i]] != cmds[names[j]] {
			return cmds[names[i]] > cmds[names[j]]
		}
		return names[i] < names[j]
	})
	var parts []string
	for _, c := range names {
		parts = append(parts, fmt.Sprintf("%s %d", c, cmds[c]))
	}
	return n, strings.Join(parts, ", ")
}

// Lost is how many times the socket overflowed since the start (events lost each time).
func (w *Watcher) Lost() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lost
}

func (w *Watcher) loop() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		n, _, err := syscall.Recvfrom(w.fd, buf, 0)
		if err != nil {
			switch {
			case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
			case errors.Is(err, syscall.ENOBUFS):
				w.mu.Lock()
				w.lost++
				w.mu.Unlock()
			default:
				return
			}
			continue
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			continue
		}
		for _, m := range msgs {
			w.event(m.Data)
		}
	}
}

func (w *Watcher) event(d []byte) {
	ne := binary.NativeEndian
	if len(d) < cnMsgHeaderLen+procEventHeaderLen+8 || ne.Uint32(d[0:]) != cnIdxProc || ne.Uint32(d[4:]) != cnValProc {
		return
	}
	ev := d[cnMsgHeaderLen:]
	data := ev[procEventHeaderLen:]
	switch ne.Uint32(ev[0:]) {
	case procEventFork:
		if len(data) < 16 {
			return
		}
		parentTgid, childPid, childTgid := int(ne.Uint32(data[4:])), int(ne.Uint32(data[8:])), int(ne.Uint32(data[12:]))
		if childPid != childTgid {
			return // a thread
		}
		w.mu.Lock()
		if g, ok := w.tgids[parentTgid]; ok {
			w.tgids[childTgid] = g
			w.forks[g]++
		}
		w.mu.Unlock()
	case procEventExec:
		tgid := int(ne.Uint32(data[4:]))
		w.mu.Lock()
		g, ok := w.tgids[tgid]
		_, root := w.roots[tgid]
		w.mu.Unlock()
		if !ok || root {
			return
		}
		name := programName(tgid)
		w.mu.Lock()
		if w.cmds[g] == nil {
			w.cmds[g] = map[string]int{}
		}
		w.cmds[g][name]++
		w.mu.Unlock()
	case procEventExit:
		pid, tgid := int(ne.Uint32(data[0:])), int(ne.Uint32(data[4:]))
		if pid != tgid {
			return
		}
		w.mu.Lock()
		if _, root := w.roots[tgid]; !root {
			delete(w.tgids, tgid)
		}
		w.mu.Unlock()
	}
}

// programName is the base name of a process's argv[0], or its comm, or "?" once it is gone.
func programName(pid int) string {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && len(b) > 0 {
		if i := bytes.IndexByte(b, 0); i >= 0 {
			b = b[:i]
		}
		return filepath.Base(string(b))
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil {
		return strings.TrimSpace(string(b))
	}
	return "?"
}
