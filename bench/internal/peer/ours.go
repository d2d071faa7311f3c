package peer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/process"
)

// startOurs runs our peer name (Ours or OursBase, each with its own
// program) from a manifest file with one NodePort Service per benchmark
// service. With --portal=none it listens on the NodePorts at 127.0.0.1
// itself and touches no kernel state. The ClusterIP in the manifest is
// never contacted.
func startOurs(_ context.Context, env Env, name string) (*Instance, error) {
	bin := env.ourBin(name)
	if bin == "" {
		if name == OursBase {
			return nil, errors.New("peer: no program given for kube-userspace-proxy-base (loadgen -proxy-base)")
		}
		return nil, errors.New("peer: kube-userspace-proxy was not built (bench/run.sh builds ./cmd/kube-userspace-proxy)")
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("peer: %s: %w", name, err)
	}
	front, err := frontends(env.Ports, true)
	if err != nil {
		return nil, err
	}
	text, err := manifests(front, env.Backends)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(env.Dir, "manifests.yaml")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		return nil, fmt.Errorf("peer: %w", err)
	}
	p, err := launch(env, name, bin,
		"--manifests", file,
		"--portal=none",
		"--bind-address=127.0.0.1",
		"--nodeport-addresses=127.0.0.1/32",
		"--healthz-bind-address=", // nginx serves no health or metrics endpoint either
		"--metrics-bind-address=",
		"-v=0")
	if err != nil {
		return nil, err
	}
	return &Instance{Name: name, Front: front, procs: []*process.Process{p}}, nil
}

// manifests renders a NodePort Service and its EndpointSlice: each frontend
// port becomes a nodePort, each backend port an endpoint port, matched by
// port name.
func manifests(front, back Addrs) (string, error) {
	type svcPort struct {
		name, proto string
		port        int
		front, back string
	}
	ports := []svcPort{
		{"echo", "TCP", 7, front.Echo, back.Echo},
		{"bulk", "TCP", 9, front.Bulk, back.Bulk},
		{"udp", "UDP", 7, front.UDP, back.UDP},
	}
	var svc, slice strings.Builder
	svc.WriteString(`apiVersion: v1
kind: Service
metadata: {name: bench, namespace: bench}
spec:
  type: NodePort
  clusterIP: 198.18.0.10
  ports:
`)
	for _, p := range ports {
		nodePort, err := portOf(p.front)
		if err != nil {
			return "", err
		}
		endpointPort, err := portOf(p.back)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&svc, "  - {name: %s, port: %d, protocol: %s, nodePort: %d}\n", p.name, p.port, p.proto, nodePort)
		fmt.Fprintf(&slice, "- {name: %s, port: %d, protocol: %s}\n", p.name, endpointPort, p.proto)
	}
	return "---\n" + svc.String() + `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: bench-1
  namespace: bench
  labels: {kubernetes.io/service-name: bench}
addressType: IPv4
ports:
` + slice.String() + `endpoints:
- addresses: ["127.0.0.1"]
  conditions: {ready: true}
`, nil
}

func portOf(hostport string) (int, error) {
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return 0, fmt.Errorf("peer: %w", err)
	}
	return strconv.Atoi(p)
}
