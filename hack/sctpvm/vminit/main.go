//go:build linux

// Command vminit is PID 1 of the SCTP test VM that hack/sctpvm/run-vm.sh
// boots. It mounts the pseudo filesystems, loads the kernel modules named
// in /modules.list (in order, as mkinitramfs resolved them), brings up lo
// with 127.0.0.1 and ::1, and runs every /tests/*.test with the arguments
// that follow "--" on the kernel command line. It then prints
//
//	SCTPVM-RESULT exit=N
//
// (0 if every test binary exited 0 and the setup worked, else 1) and powers
// the VM off. run-vm.sh reads that marker; a VM that dies before printing it
// (a panic, a hang) counts as a failure there.
//
// The tests see SCTP_REQUIRED=1, so an SCTP test fails instead of skipping
// when the kernel has no SCTP, and KUP_PROXY_BIN=/bin/kube-userspace-proxy.
//
// If the kernel command line sets SCTPVM_BUDGET=SECONDS, a test binary still
// running that many seconds after boot gets SIGQUIT (a Go binary prints its
// goroutines and exits), and binaries not yet started are not run. Each
// binary's -test.timeout bounds only itself, so without a budget several
// slow binaries would add up past the host's timeout, and the run would end
// with no result and no clue where it hung.
//
// It must be a static binary: build it with CGO_ENABLED=0.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// env is what every test binary gets on top of what the kernel passed to
// PID 1 (HOME, TERM and any unknown key=value boot parameters).
var env = []string{
	"SCTPVM_BUDGET=", // vminit's own
	"SCTP_REQUIRED=1",
	"KUP_PROXY_BIN=/bin/kube-userspace-proxy",
	"PATH=/bin",
	"HOME=/tmp",
	"TMPDIR=/tmp",
}

func logf(format string, args ...any) {
	fmt.Printf("vminit: "+format+"\n", args...)
}

func main() {
	code := run()
	// A test's last line may lack its newline; the marker needs its own line.
	fmt.Printf("\nSCTPVM-RESULT exit=%d\n", code)
	powerOff()
}

// run sets up the VM and runs the tests; it returns the result code.
func run() int {
	ok := true
	if err := mountAll(); err != nil {
		logf("error: %v", err)
		ok = false
	}
	if err := loadModules("/modules.list"); err != nil {
		logf("error: %v", err)
		ok = false
	}
	printModules()
	if err := loopbackUp(); err != nil {
		logf("error: %v", err)
		ok = false
	}
	raiseNofile()
	logf("ready after %s of kernel uptime", uptime())

	tests, err := filepath.Glob("/tests/*.test")
	if err != nil || len(tests) == 0 {
		logf("error: no /tests/*.test to run")
		return 1
	}
	args := testArgs()
	deadline := budgetDeadline()
	testEnv := mergeEnv(os.Environ(), env)
	for _, t := range tests {
		if !deadline.IsZero() && time.Until(deadline) <= 0 {
			logf("%s not run: SCTPVM_BUDGET=%s is spent", t, os.Getenv("SCTPVM_BUDGET"))
			ok = false
			continue
		}
		if !runTest(t, args, testEnv, deadline) {
			ok = false
		}
	}
	if !ok {
		return 1
	}
	return 0
}

func mountAll() error {
	const common = unix.MS_NOSUID | unix.MS_NODEV
	mounts := []struct {
		source, target, fstype string
		flags                  uintptr
		data                   string
	}{
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		{"proc", "/proc", "proc", common | unix.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", common | unix.MS_NOEXEC, ""},
		{"tmpfs", "/tmp", "tmpfs", common, "mode=1777"},
		{"tmpfs", "/run", "tmpfs", common, "mode=0755"},
	}
	var errs []error
	for _, m := range mounts {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
		// EBUSY: the kernel mounted it already (CONFIG_DEVTMPFS_MOUNT).
		if err != nil && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err))
		}
	}
	// devtmpfs has no /dev/fd or /dev/std*, which some programs expect.
	for name, target := range map[string]string{
		"/dev/fd":     "/proc/self/fd",
		"/dev/stdin":  "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1",
		"/dev/stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, name); err != nil && !errors.Is(err, os.ErrExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// loadModules loads every module file listed in list, one path a line,
// in order. A module that is already loaded is fine.
func loadModules(list string) error {
	f, err := os.Open(list)
	if errors.Is(err, os.ErrNotExist) {
		logf("no %s: loading no modules", list)
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var errs []error
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.TrimSpace(sc.Text())
		if p == "" || strings.HasPrefix(p, "#") {
			continue
		}
		n++
		start := time.Now()
		switch err := loadModule(p); {
		case errors.Is(err, unix.EEXIST):
			logf("module %s: already loaded", filepath.Base(p))
		case err != nil:
			errs = append(errs, fmt.Errorf("load module %s: %w", p, err))
		default:
			logf("module %s: loaded in %s", filepath.Base(p), time.Since(start).Round(time.Millisecond))
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if n == 0 {
		logf("%s is empty: loading no modules", list)
	}
	return errors.Join(errs...)
}

func loadModule(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	flags := 0
	// mkinitramfs ships only plain .ko, but the kernel can decompress.
	if ext := filepath.Ext(p); ext == ".xz" || ext == ".zst" || ext == ".gz" {
		flags |= unix.MODULE_INIT_COMPRESSED_FILE
	}
	return unix.FinitModule(int(f.Fd()), "", flags)
}

// printModules logs /proc/modules: name, size, use count and users.
func printModules() {
	b, err := os.ReadFile("/proc/modules")
	if err != nil {
		logf("read /proc/modules: %v", err)
		return
	}
	if len(b) == 0 {
		logf("/proc/modules: no modules loaded")
		return
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 4 {
			logf("/proc/modules: %s", strings.Join(f[:4], " "))
		}
	}
}

// loopbackUp sets IFF_UP on lo. The kernel then gives it 127.0.0.1/8 and,
// with IPv6 enabled on it, ::1 (loopback addresses skip DAD).
func loopbackUp() error {
	// IPv6 is on by default; make sure nothing turned it off for lo.
	for _, conf := range []string{"all", "default", "lo"} {
		p := "/proc/sys/net/ipv6/conf/" + conf + "/disable_ipv6"
		if err := os.WriteFile(p, []byte("0\n"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			logf("enable IPv6: %v", err)
		}
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: SIOCGIFFLAGS: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: SIOCSIFFLAGS: %w", err)
	}
	var errs []error
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("lo up: listen on %s: %w", addr, err))
			continue
		}
		l.Close()
	}
	if len(errs) == 0 {
		logf("lo up: 127.0.0.1 and ::1 usable")
	}
	return errors.Join(errs...)
}

// raiseNofile lifts RLIMIT_NOFILE for the tests, which inherit it. It uses
// package syscall so that os/exec passes the new limit on (it restores the
// limit it saw at start-up otherwise).
func raiseNofile() {
	want := syscall.Rlimit{Cur: 1 << 20, Max: 1 << 20} // fs.nr_open's default
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err == nil {
		return
	}
	var cur syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &cur); err != nil {
		return
	}
	cur.Cur = cur.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &cur); err != nil {
		logf("raise RLIMIT_NOFILE: %v", err)
	}
}

// testArgs returns the words after " -- " on the kernel command line. The
// kernel also passes them as PID 1's argv, but mixed with any boot
// parameter it did not recognise, so /proc/cmdline is the exact source.
func testArgs() []string {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return os.Args[1:]
	}
	words := strings.Fields(string(b))
	for i, w := range words {
		if w == "--" {
			return words[i+1:]
		}
	}
	return nil
}

// mergeEnv returns base with the KEY=VALUE entries of over replacing or
// adding to it; a KEY= entry in over removes KEY.
func mergeEnv(base, over []string) []string {
	keys := map[string]bool{}
	for _, kv := range over {
		k, _, _ := strings.Cut(kv, "=")
		keys[k] = true
	}
	var out []string
	for _, kv := range base {
		if k, _, _ := strings.Cut(kv, "="); !keys[k] {
			out = append(out, kv)
		}
	}
	for _, kv := range over {
		if !strings.HasSuffix(kv, "=") {
			out = append(out, kv)
		}
	}
	return out
}

// budgetDeadline turns SCTPVM_BUDGET (seconds since boot) into a time, or
// returns the zero time if it is unset or invalid.
func budgetDeadline() time.Time {
	v := os.Getenv("SCTPVM_BUDGET")
	if v == "" {
		return time.Time{}
	}
	budget, err := strconv.ParseFloat(v, 64)
	up, err2 := strconv.ParseFloat(strings.TrimSuffix(uptime(), "s"), 64)
	if err != nil || err2 != nil || budget <= 0 {
		logf("ignoring SCTPVM_BUDGET=%q", v)
		return time.Time{}
	}
	return time.Now().Add(time.Duration((budget - up) * float64(time.Second)))
}

// runTest runs one test binary in /tmp, its output on the console, and
// reports whether it exited 0. At deadline, unless zero, it gets SIGQUIT
// and 5 s later SIGKILL. Anything it leaves running in its process group
// is killed, and orphans that PID 1 inherited are reaped.
func runTest(path string, args, env []string, deadline time.Time) bool {
	logf("running %s %s", path, strings.Join(args, " "))
	start := time.Now()
	cmd := exec.Command(path, args...)
	cmd.Dir = "/tmp"
	cmd.Env = env
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err := cmd.Start()
	if err == nil {
		pid := cmd.Process.Pid
		if !deadline.IsZero() {
			quit := time.AfterFunc(time.Until(deadline), func() {
				logf("SCTPVM_BUDGET spent: SIGQUIT to %s", path)
				_ = syscall.Kill(-pid, syscall.SIGQUIT)
				time.AfterFunc(5*time.Second, func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
			})
			defer quit.Stop()
		}
		err = cmd.Wait()
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	reap()
	took := time.Since(start).Round(time.Millisecond)
	if err != nil {
		logf("%s failed after %s: %v", path, took, err)
		return false
	}
	logf("%s exited 0 after %s", path, took)
	return true
}

// reap collects exited children without blocking.
func reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

func uptime() string {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0] + "s"
}

// powerOff stops the VM. If power-off fails, a restart does too, because
// run-vm.sh starts qemu with -no-reboot. PID 1 must never exit: that
// panics the kernel.
func powerOff() {
	unix.Sync()
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	logf("power off: %v; restarting instead", err)
	err = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	logf("restart: %v", err)
	for {
		time.Sleep(time.Hour)
	}
}
