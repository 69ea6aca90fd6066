// Package linuxonly calls a system call only Linux has, in a file with no build constraint:
// it builds for Linux and not for macOS, as a real mistake of that kind would.
package linuxonly

import "syscall"

// ThreadID is the calling thread's ID.
func ThreadID() int { return syscall.Gettid() }
