//go:build !linux || goroutines

package userspace

// kernelSourceFilter says whether load-balancer IP sockets carry a socket
// filter of their source ranges (see sourcefilter_linux.go); this build's
// have none, and servicePort.admits refuses other sources itself.
const kernelSourceFilter = false
