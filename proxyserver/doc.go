// Package proxyserver wires kube-userspace-proxy together: it owns the
// command-line options, the KubeProxyConfiguration file (--config) and
// their validation, and Run, which connects a source of state.Snapshots to
// the userspace data plane through one coalescing sync loop. It also owns
// what operators ask the proxy: /healthz and /livez with kube-proxy's
// rule, /metrics, /debug/services, and the health-check node ports.
//
// It leaves the meaning of Services and EndpointSlices to package source,
// moving bytes to package userspace and kernel redirection to package
// portal. The main package only parses flags into a Config, validates it
// and calls Run:
//
//	cfg := proxyserver.NewConfig()
//	cfg.AddFlags(pflag.CommandLine)
//	pflag.Parse()
//	if err := cfg.LoadConfigFile(pflag.CommandLine); err != nil { ... }
//	if err := cfg.Validate(); err != nil { ... }
//	err := proxyserver.Run(ctx, cfg)
package proxyserver
