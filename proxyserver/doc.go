// Package proxyserver wires kube-userspace-proxy together: it owns the
// command-line options and their validation, and Run, which connects a
// source of state.Snapshots to the userspace data plane through one
// coalescing sync loop.
//
// It leaves the meaning of Services and EndpointSlices to package source,
// moving bytes to package userspace and kernel redirection to package
// portal. The main package only parses flags into a Config, validates it
// and calls Run:
//
//	cfg := proxyserver.NewConfig()
//	cfg.AddFlags(pflag.CommandLine)
//	pflag.Parse()
//	if err := cfg.Validate(); err != nil { ... }
//	err := proxyserver.Run(ctx, cfg)
package proxyserver
