// Package procstat reads what a process tree holds from Linux /proc: resident
// memory (VmRSS of /proc/PID/status) and open file descriptors (entries of
// /proc/PID/fd), summed over the given processes and all their descendants,
// so that forking peers (socat) and master/worker peers (nginx) are measured
// whole.
//
// It owns the parsing only; deciding when to sample is package suite's job.
//
//	u, err := procstat.Tree(pid)
//	fmt.Println(u.Procs, u.RSSBytes, u.FDs)
package procstat
