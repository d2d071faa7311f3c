package procstat

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Usage is what a process tree holds at one moment.
type Usage struct {
	Procs    int   // processes in the tree
	RSSBytes int64 // sum of VmRSS
	// PSSBytes is the sum of Pss from /proc/PID/smaps_rollup: resident
	// memory with each shared page split among its sharers, so that forked
	// processes are not counted many times over. Zero when unavailable.
	PSSBytes int64
	FDs      int // sum of open file descriptors
	// CPU is the processor time used so far (user and system), counting
	// children that exited and were waited for: the growth between two
	// samples is what the tree spent in between.
	CPU time.Duration
}

// userHZ is the unit of the times in /proc/PID/stat: fixed at 100 per second
// on Linux, whatever the kernel's own tick rate.
const userHZ = 100

// Tree samples the processes roots and all their descendants. Processes that
// exit while being read are skipped; a root that cannot be read is an error.
func Tree(roots ...int) (Usage, error) {
	return treeAt("/proc", roots)
}

func treeAt(procRoot string, roots []int) (Usage, error) {
	children, err := childrenMap(procRoot)
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	seen := make(map[int]bool)
	queue := append([]int(nil), roots...)
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		queue = append(queue, children[pid]...)

		rss, err := vmRSS(procRoot, pid)
		if err != nil {
			if isRoot(pid, roots) {
				return Usage{}, err
			}
			continue // a child that just exited
		}
		fds, err := countFDs(procRoot, pid)
		if err != nil {
			if isRoot(pid, roots) {
				return Usage{}, err
			}
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat")); err == nil {
			if cpu, err := parseCPU(stat); err == nil {
				u.CPU += cpu
			}
		}
		u.Procs++
		u.RSSBytes += rss
		u.PSSBytes += pss(procRoot, pid)
		u.FDs += fds
	}
	return u, nil
}

func isRoot(pid int, roots []int) bool {
	for _, r := range roots {
		if r == pid {
			return true
		}
	}
	return false
}

// childrenMap maps every pid under procRoot to the pids whose parent it is.
func childrenMap(procRoot string) (map[int][]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("procstat: %w", err)
	}
	children := make(map[int][]int)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		ppid, err := parsePPID(stat)
		if err != nil {
			continue
		}
		children[ppid] = append(children[ppid], pid)
	}
	return children, nil
}

// parsePPID returns the fourth field of /proc/PID/stat. The second field, the
// command name in parentheses, may itself hold spaces and parentheses, so
// the fields are counted from the last ')'.
func parsePPID(stat []byte) (int, error) {
	fields, err := statFields(stat, 2)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(fields[1])
}

// statFields returns the fields of /proc/PID/stat after the command name,
// at least want of them: the state is fields[0], the ppid fields[1].
func statFields(stat []byte, want int) ([]string, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return nil, errors.New("procstat: malformed stat")
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < want {
		return nil, errors.New("procstat: malformed stat")
	}
	return fields, nil
}

// parseCPU returns utime+stime+cutime+cstime (fields 14 to 17) of
// /proc/PID/stat.
func parseCPU(stat []byte) (time.Duration, error) {
	fields, err := statFields(stat, 15)
	if err != nil {
		return 0, err
	}
	var ticks int64
	for _, f := range fields[11:15] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("procstat: malformed stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// vmRSS returns VmRSS of /proc/PID/status in bytes.
func vmRSS(procRoot string, pid int) (int64, error) {
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	defer f.Close()
	return parseKB(f, "VmRSS:")
}

// pss returns Pss of /proc/PID/smaps_rollup in bytes, or 0 when it cannot be
// read (kernels before 4.14 have no smaps_rollup).
func pss(procRoot string, pid int) int64 {
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "smaps_rollup"))
	if err != nil {
		return 0
	}
	defer f.Close()
	b, err := parseKB(f, "Pss:")
	if err != nil {
		return 0
	}
	return b
}

// parseKB returns the value of the first "<key> <n> kB" line in bytes, or 0
// when there is no such line (kernel threads and zombies have no VmRSS).
func parseKB(r io.Reader, key string) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), key)
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("procstat: malformed line %q", sc.Text())
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("procstat: %s %w", key, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	return 0, nil
}

// countFDs returns the number of entries in /proc/PID/fd.
func countFDs(procRoot string, pid int) (int, error) {
	d, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "fd"))
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	return len(names), nil
}

// Machine is the CPU time of the whole machine so far, from the first line
// of /proc/stat: Busy is every state but idle and iowait, Total all of them.
// The growth between two samples says how much of the machine a test kept
// busy, and, divided by its work, what each unit of work cost every process
// together.
type Machine struct {
	Busy, Total time.Duration
}

// Utilization is the busy share of the machine between m and a later sample.
func (m Machine) Utilization(later Machine) float64 {
	total := later.Total - m.Total
	if total <= 0 {
		return 0
	}
	return float64(later.Busy-m.Busy) / float64(total)
}

// System samples the machine's CPU time.
func System() (Machine, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Machine{}, fmt.Errorf("procstat: %w", err)
	}
	return parseSystem(b)
}

// parseSystem reads the aggregate "cpu" line of /proc/stat: user nice system
// idle iowait irq softirq steal ..., in USER_HZ ticks. Steal counts as
// busy: the machine had no CPU to give then either.
func parseSystem(stat []byte) (Machine, error) {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	fields := strings.Fields(string(line))
	if len(fields) < 5 || fields[0] != "cpu" {
		return Machine{}, errors.New("procstat: malformed /proc/stat")
	}
	var m Machine
	// guest and guest_nice (9th and 10th) are already counted in user and
	// nice.
	for i, f := range fields[1:min(len(fields), 9)] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return Machine{}, fmt.Errorf("procstat: malformed /proc/stat: %w", err)
		}
		d := time.Duration(n) * time.Second / userHZ
		m.Total += d
		if i != 3 && i != 4 { // idle, iowait
			m.Busy += d
		}
	}
	return m, nil
}
