package peer

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/process"
)

// Where Debian's libnginx-mod-stream puts the dynamic stream module.
const nginxStreamModule = "/usr/lib/nginx/modules/ngx_stream_module.so"

const (
	// nginxWorkerConns bounds one worker's connections, client and upstream
	// sides together; it must stay below RLIMIT_NOFILE.
	nginxWorkerConns = 19000
	nginxRlimitFiles = 20000
)

// startNginx starts nginx, or nginx-halfclose: the same with
// proxy_half_close on.
func startNginx(ctx context.Context, env Env, name string) (*Instance, error) {
	if _, err := exec.LookPath("nginx"); err != nil {
		return nil, fmt.Errorf("peer: nginx is not installed: %w", err)
	}
	module, err := nginxModuleLine(ctx)
	if err != nil {
		return nil, err
	}
	front, err := frontends(env.Ports, true)
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(env.Dir, "nginx.conf")
	text := nginxConfig(front, env.Backends, env.Dir, module, name == NginxHalfClose)
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		return nil, fmt.Errorf("peer: %w", err)
	}
	// "daemon off" in the file keeps the master in the foreground: the pid
	// we started is the master, and its workers are its children. -e keeps
	// nginx away from the system error log before it reads the file.
	p, err := launch(env, "nginx", "nginx", "-p", env.Dir+"/", "-c", cfg,
		"-e", filepath.Join(env.Dir, "nginx-error.log"))
	if err != nil {
		return nil, err
	}
	return &Instance{Name: name, Front: front, procs: []*process.Process{p}}, nil
}

// nginxModuleLine returns the load_module line the stream module needs, or
// "" when nginx was built with it.
func nginxModuleLine(ctx context.Context) (string, error) {
	if _, err := os.Stat(nginxStreamModule); err == nil {
		return "load_module " + nginxStreamModule + ";", nil
	}
	out, _ := exec.CommandContext(ctx, "nginx", "-V").CombinedOutput()
	for _, f := range strings.Fields(string(out)) {
		if f == "--with-stream" {
			return "", nil
		}
	}
	return "", fmt.Errorf("peer: nginx has no stream module (install libnginx-mod-stream)")
}

// nginxConfig renders a stream configuration with one server per service,
// the UDP one included. halfClose turns proxy_half_close on.
func nginxConfig(front, back Addrs, dir, moduleLine string, halfClose bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, `%s
daemon off;
master_process on;
worker_processes auto;
worker_rlimit_nofile %d;
pid %s;
error_log %s warn;

events {
	worker_connections %d;
}

stream {
	proxy_connect_timeout 5s;
	proxy_timeout 5m;
`, moduleLine, nginxRlimitFiles, filepath.Join(dir, "nginx.pid"), filepath.Join(dir, "nginx-error.log"), nginxWorkerConns)
	if halfClose {
		b.WriteString("\tproxy_half_close on;\n")
	}
	fmt.Fprintf(&b, "\tserver {\n\t\tlisten %s backlog=4096;\n\t\tproxy_pass %s;\n\t}\n", front.Echo, back.Echo)
	fmt.Fprintf(&b, "\tserver {\n\t\tlisten %s backlog=4096;\n\t\tproxy_pass %s;\n\t}\n", front.Bulk, back.Bulk)
	if front.UDP != "" {
		fmt.Fprintf(&b, "\tserver {\n\t\tlisten %s udp;\n\t\tproxy_pass %s;\n\t\tproxy_timeout 10s;\n\t}\n", front.UDP, back.UDP)
	}
	b.WriteString("}\n")
	return b.String()
}
