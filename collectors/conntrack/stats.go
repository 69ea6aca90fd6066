package conntrack

import (
	"github.com/ti-mo/conntrack"
)

// cpuStats are the kernel's per-CPU conntrack statistics summed over CPUs.
type cpuStats struct {
	found, invalid, ignore, insert, insertFailed, drop, earlyDrop, error, searchRestart uint64
}

type tableStats struct {
	entries, limit uint64
	cpu            cpuStats
}

// readStats asks the kernel over netlink (the same queries as `conntrack -S` and `-C`). A new
// socket per scrape keeps a failed one from lingering; it costs microseconds.
func readStats() (tableStats, error) {
	conn, err := conntrack.Dial(nil)
	if err != nil {
		return tableStats{}, describeNetlinkError("open conntrack netlink socket for stats", err)
	}
	defer conn.Close()
	perCPU, err := conn.Stats()
	if err != nil {
		return tableStats{}, describeNetlinkError("read conntrack per-CPU stats", err)
	}
	global, err := conn.StatsGlobal()
	if err != nil {
		return tableStats{}, describeNetlinkError("read conntrack table size", err)
	}
	return tableStats{entries: uint64(global.Entries), limit: uint64(global.MaxEntries), cpu: sumCPUStats(perCPU)}, nil
}

func sumCPUStats(perCPU []conntrack.Stats) cpuStats {
	var s cpuStats
	for _, c := range perCPU {
		s.found += uint64(c.Found)
		s.invalid += uint64(c.Invalid)
		s.ignore += uint64(c.Ignore)
		s.insert += uint64(c.Insert)
		s.insertFailed += uint64(c.InsertFailed)
		s.drop += uint64(c.Drop)
		s.earlyDrop += uint64(c.EarlyDrop)
		s.error += uint64(c.Error)
		s.searchRestart += uint64(c.SearchRestart)
	}
	return s
}
