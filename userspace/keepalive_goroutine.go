//go:build !linux || goroutines

package userspace

import "net"

// listenConfig turns keep-alive on for every accepted connection.
func listenConfig() net.ListenConfig {
	return net.ListenConfig{KeepAliveConfig: keepAlive}
}
