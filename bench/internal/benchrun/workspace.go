package benchrun

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
)

// Setup says how Prepare sets a benchmark run up.
type Setup struct {
	NSPrefix  string        // the run's namespaces: leftovers of a killed run are removed
	TmpPrefix string        // the temporary directory's name prefix
	Repo      string        // the repository measured; "" finds it upwards
	LockWait  time.Duration // how long to wait for another benchmark's lock (0: fail at once)
	KeepTmp   bool          // keep the temporary directory for its logs
}

// Workspace is what a benchmark run holds while it runs.
type Workspace struct {
	Repo, Tmp string
	release   []func()
}

// Prepare takes the benchmark lock, removes leftover namespaces, finds the repository and
// makes the temporary directory. Close gives them back.
func Prepare(ctx context.Context, s Setup) (w *Workspace, err error) {
	w = &Workspace{Repo: s.Repo}
	defer func() {
		if err != nil {
			w.Close()
			w = nil
		}
	}()
	unlock, err := benchns.LockWithin(ctx, s.LockWait, func(err error) {
		Logf("%v; waiting up to %s", err, s.LockWait)
	})
	if err != nil {
		return w, err
	}
	w.release = append(w.release, unlock)
	if err := benchns.RemoveLeftovers(s.NSPrefix); err != nil {
		return w, err
	}
	if w.Repo == "" {
		if w.Repo, err = FindRepo(); err != nil {
			return w, err
		}
	}
	if w.Tmp, err = os.MkdirTemp("", s.TmpPrefix); err != nil {
		return w, err
	}
	if s.KeepTmp {
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

// LockWaitFlag defines --lock-wait, the wait for another benchmark's lock, in fs.
func LockWaitFlag(fs *flag.FlagSet, p *time.Duration) {
	fs.DurationVar(p, "lock-wait", 0, "wait up to this long for another benchmark to release "+benchns.BenchLock+" (0: fail at once)")
}
