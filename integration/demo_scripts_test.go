//go:build integration && linux

package integration

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// demoTree makes a copy of what `make run` and `make demo` use (the
// Makefile, hack/run.sh, hack/demo.sh and hack/demo-lib.sh, the binary under
// test and bin/demo) with manifest as its examples/demo.yaml, so a test can
// break the manifest without touching the checkout's. It returns the
// copy's directory and the directory its scripts' temporary files go to.
func demoTree(t *testing.T, manifest string) (dir, tmp string) {
	t.Helper()
	dir = t.TempDir()
	for _, d := range []string{"hack", "bin", "examples", "tmp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"Makefile", "hack/run.sh", "hack/demo.sh", "hack/demo-lib.sh"} {
		b, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, f), string(b))
		if err := os.Chmod(filepath.Join(dir, f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "examples/demo.yaml"), manifest)
	if err := os.Symlink(proxyBin, filepath.Join(dir, "bin/kube-userspace-proxy")); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "bin/demo"), "../examples/demo").CombinedOutput(); err != nil {
		t.Fatalf("build bin/demo: %v\n%s", err, out)
	}
	return dir, filepath.Join(dir, "tmp")
}

// bundledDemo is the checkout's examples/demo.yaml.
func bundledDemo(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../examples/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// startMake runs `make TARGET` in dir (its build step taken as done) in a
// process group of its own, as a terminal runs it, with TMPDIR set to tmp;
// its standard output and error are the returned process's log.
func startMake(t *testing.T, dir, tmp, target string) *proxyProc {
	t.Helper()
	cmd := exec.Command("make", "--no-print-directory", "-o", "build", target)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proxyProc{t: t, cmd: cmd, done: make(chan struct{}), notify: make(chan struct{})}
	go p.read(out)
	t.Cleanup(func() {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			t.Errorf("make %s did not end; killing its process group", target)
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("make %s:\n%s", target, p.log())
		}
	})
	return p
}

// ctrlC sends SIGINT to the process group of p, as a terminal's Ctrl-C
// does; a group already gone has nothing left to interrupt.
func ctrlC(t *testing.T, p *proxyProc) {
	t.Helper()
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT); err != nil && err != syscall.ESRCH {
		t.Fatal(err)
	}
}

// endsWithin waits for p to end.
func endsWithin(t *testing.T, p *proxyProc, d time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("not ended %v after Ctrl-C", d)
	}
}

// leftIn fails the test when dir is not empty: the scripts' temporary files.
func leftIn(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left behind in TMPDIR: %s", e.Name())
	}
}

// TestMakeRunDemoBrokenManifest: when examples/demo.yaml does not load, the
// proxy exits with the FILE:LINE of each bad document. `make run` and `make
// demo` must say that it exited and how to put the bundled manifest back,
// not blame a port held by another program.
func TestMakeRunDemoBrokenManifest(t *testing.T) {
	requireTool(t, "make")
	broken := strings.ReplaceAll(bundledDemo(t), "\nkind: Service\n", "\nkind: Servic\n")
	for _, target := range []string{"run", "demo"} {
		t.Run(target, func(t *testing.T) {
			if target == "demo" {
				requireTool(t, "curl")
			}
			dir, tmp := demoTree(t, broken)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-o", "build", target)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
			b, err := cmd.CombinedOutput()
			out := string(b)
			if err == nil {
				t.Fatalf("make %s succeeded with a broken examples/demo.yaml:\n%s", target, out)
			}
			for _, want := range []string{
				"the proxy exited (status 1) before it served the demo",
				`examples/demo.yaml:10: document 1 (Servic demo/web): kind: "Servic" is not a kind`,
				"'git checkout examples/demo.yaml' puts back the bundled one",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("make %s does not say %q:\n%s", target, want, out)
				}
			}
			for _, bad := range []string{"could not open", "another program", "another 'make run'"} {
				if strings.Contains(out, bad) {
					t.Errorf("make %s blames a port (%q) for a broken manifest:\n%s", target, bad, out)
				}
			}
			leftIn(t, tmp)
		})
	}
}

// TestMakeRunCtrlC: Ctrl-C of `make run` (SIGINT to its process group)
// lets the proxy shut down and show its last log line, and exit 0, not
// die writing it to a pipe whose reader Ctrl-C killed; a second Ctrl-C
// soon after must not cut the clean-up short. Its banner suggests the
// health and metrics ports only when this run serves them.
func TestMakeRunCtrlC(t *testing.T) {
	requireTool(t, "make")
	for _, tc := range []struct {
		name  string
		again string // a second Ctrl-C: "" none, "now" at once, else once the output has this
	}{
		{"once", ""},
		{"twice at once", "now"},
		{"again at the shutdown line", `"Shutting down`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, tmp := demoTree(t, bundledDemo(t))
			p := startMake(t, dir, tmp, "run")
			p.waitLog(0, `Ctrl-C to stop`, 1, 30*time.Second)
			for _, want := range []string{"curl http://127.0.0.1:10256/healthz", "curl http://127.0.0.1:10249/debug/services"} {
				if !strings.Contains(p.log(), want) {
					t.Errorf("the banner does not suggest %q though this run serves it:\n%s", want, p.log())
				}
			}
			ctrlC(t, p)
			switch tc.again {
			case "":
			case "now":
				ctrlC(t, p)
			default:
				p.waitLog(0, tc.again, 1, 20*time.Second)
				ctrlC(t, p)
			}
			endsWithin(t, p, 20*time.Second)
			out := p.log()
			if !strings.Contains(out, `"Shutting down; open connections and sessions are closed"`) {
				t.Errorf("the proxy's shutdown line is not shown:\n%s", out)
			}
			if strings.Contains(out, "the proxy exited with status") {
				t.Errorf("the proxy did not exit cleanly:\n%s", out)
			}
			leftIn(t, tmp)
		})
	}

	t.Run("health and metrics ports held", func(t *testing.T) {
		for _, addr := range []string{"127.0.0.1:10256", "127.0.0.1:10249"} {
			ln, err := net.Listen("tcp4", addr)
			if err != nil {
				t.Fatalf("hold %s: %v", addr, err)
			}
			defer ln.Close()
		}
		dir, tmp := demoTree(t, bundledDemo(t))
		p := startMake(t, dir, tmp, "run")
		p.waitLog(0, `Ctrl-C to stop`, 1, 30*time.Second)
		_, banner, _ := strings.Cut(p.log(), "is serving examples/demo.yaml")
		for _, bad := range []string{":10256", ":10249/debug"} {
			if strings.Contains(banner, "curl http://127.0.0.1"+bad) {
				t.Errorf("the banner suggests %s, which another program holds:\n%s", bad, banner)
			}
		}
		for _, want := range []string{"Not served by this run", `"Cannot serve /healthz`, `"Cannot serve /metrics`} {
			if !strings.Contains(banner, want) {
				t.Errorf("the banner does not say %q:\n%s", want, banner)
			}
		}
		ctrlC(t, p)
		endsWithin(t, p, 20*time.Second)
		leftIn(t, tmp)
	})
}
