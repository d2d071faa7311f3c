// Package process starts and stops the benchmark's child processes: peers
// (proxies), the backend servers and the idle-connection holders.
//
// Each child runs in a process group of its own, so a Ctrl-C on the terminal
// reaches only the driver, which then stops the children itself, and so the
// workers and forks of a peer (nginx, socat) are stopped with it. Children are
// only ever signalled through the process id that Start returned, never by
// name. On Linux a child also gets SIGKILL if the driver dies.
//
//	p, err := process.Start(process.Config{Argv: []string{"haproxy", "-db", "-f", cfg}, Log: logPath})
//	if err != nil { ... }
//	defer p.Stop()
package process
