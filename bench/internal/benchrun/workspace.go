package benchrun

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
)

// Flags are the flags every benchmark takes.
type Flags struct {
	Repo     string        // the repository measured; "" finds it upwards
	Out      string        // also write the report here
	KeepTmp  bool          // keep the temporary directory for its logs
	LockWait time.Duration // how long to wait for another benchmark's lock (0: fail at once)
}

// Register defines --repo, --out and --keep-tmp in fs; kept says what the temporary
// directory holds. --lock-wait is LockWaitFlag's, for the benchmarks that share the lock.
func (f *Flags) Register(fs *flag.FlagSet, kept string) {
	fs.StringVar(&f.Repo, "repo", "", "proxyhealth repository root (default: found upwards from the working directory)")
	fs.StringVar(&f.Out, "out", "", "also write the markdown report to this file")
	fs.BoolVar(&f.KeepTmp, "keep-tmp", false, "keep the temporary directory ("+kept+")")
}

// LockWaitFlag defines --lock-wait, the wait for another benchmark's lock, in fs.
func (f *Flags) LockWaitFlag(fs *flag.FlagSet) {
	fs.DurationVar(&f.LockWait, "lock-wait", 0, "wait up to this long for another benchmark to release "+benchns.BenchLock+" (0: fail at once)")
}

// Workspace is what a benchmark run holds while it runs.
type Workspace struct {
	Tmp     string // the temporary directory
	release []func()
}

// Prepare takes the benchmark lock, removes the leftover namespaces named with nsPrefix, finds
// the repository (into f.Repo when it is "") and makes the temporary directory (named with
// tmpPrefix). Close gives them back.
func Prepare(ctx context.Context, nsPrefix, tmpPrefix string, f *Flags) (w *Workspace, err error) {
	w = &Workspace{}
	defer func() {
		if err != nil {
			w.Close()
			w = nil
		}
	}()
	unlock, err := benchns.LockWithin(ctx, f.LockWait, func(err error) {
		Logf("%v; waiting up to %s", err, f.LockWait)
	})
	if err != nil {
		return w, err
	}
	w.release = append(w.release, unlock)
	if err := benchns.RemoveLeftovers(nsPrefix); err != nil {
		return w, err
	}
	if f.Repo == "" {
		if f.Repo, err = FindRepo(); err != nil {
			return w, err
		}
	}
	if w.Tmp, err = os.MkdirTemp("", tmpPrefix); err != nil {
		return w, err
	}
	if f.KeepTmp {
		fmt.Fprintf(os.Stderr, "keeping %s\n", w.Tmp)
	} else {
		tmp := w.Tmp
		w.release = append(w.release, func() { os.RemoveAll(tmp) })
	}
	return w, nil
}

// Close removes the temporary directory (unless kept) and releases the lock.
func (w *Workspace) Close() {
	for i := len(w.release) - 1; i >= 0; i-- {
		w.release[i]()
	}
	w.release = nil
}
