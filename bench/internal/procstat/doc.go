// Package procstat reads what a process tree holds from Linux /proc: resident
// memory (VmRSS of /proc/PID/status), open file descriptors (entries of
// /proc/PID/fd) and CPU time used (/proc/PID/stat), summed over the given
// processes and all their descendants, so that forking peers (socat) and
// master/worker peers (nginx) are measured whole. System reads the whole
// machine's busy and total CPU time from /proc/stat.
//
// It owns the parsing only; deciding when to sample is package suite's job.
//
//	u, err := procstat.Tree(pid)
//	fmt.Println(u.Procs, u.RSSBytes, u.FDs, u.CPU)
//	m, err := procstat.System()
//	fmt.Println(m.Busy, m.Total)
package procstat
