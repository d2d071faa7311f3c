package process

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

const (
	// termGrace is how long Stop waits after SIGTERM before SIGKILL.
	termGrace = 5 * time.Second
	killGrace = 2 * time.Second
	// groupGrace bounds the wait for orphaned forks (thousands of socat
	// children) to be reaped by init.
	groupGrace = 10 * time.Second
	// logTailBytes is how much of a log an error message quotes.
	logTailBytes = 600
)

// Config describes one child process.
type Config struct {
	Argv []string // program and arguments; the program is looked up in PATH
	// Log receives the child's stdout and stderr. If empty, they are
	// discarded. Ignored for stdout when Pipes is set.
	Log string
	// Pipes connects the child's stdin and stdout to Process.Stdin and
	// Process.Stdout.
	Pipes bool
	// Env is added to the driver's environment.
	Env []string
}

// Process is a running child.
type Process struct {
	Stdin  *os.File // set when Config.Pipes
	Stdout *os.File // set when Config.Pipes

	cmd     *exec.Cmd
	log     string
	done    chan struct{} // closed when the child has exited
	waitErr error         // set before done is closed
}

// Start starts the child.
func Start(cfg Config) (*Process, error) {
	if len(cfg.Argv) == 0 {
		return nil, errors.New("process: empty command")
	}
	cmd := exec.Command(cfg.Argv[0], cfg.Argv[1:]...)
	cmd.SysProcAttr = sysProcAttr()
	if len(cfg.Env) > 0 {
		cmd.Env = append(os.Environ(), cfg.Env...)
	}
	p := &Process{cmd: cmd, log: cfg.Log, done: make(chan struct{})}

	var logFile *os.File
	if cfg.Log != "" {
		f, err := os.Create(cfg.Log)
		if err != nil {
			return nil, fmt.Errorf("process: %w", err)
		}
		defer f.Close()
		logFile = f
		cmd.Stdout, cmd.Stderr = f, f
	}
	var childEnds []*os.File
	if cfg.Pipes {
		inR, inW, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("process: %w", err)
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			inR.Close()
			inW.Close()
			return nil, fmt.Errorf("process: %w", err)
		}
		cmd.Stdin, cmd.Stdout = inR, outW
		if logFile == nil {
			cmd.Stderr = nil
		}
		p.Stdin, p.Stdout = inW, outR
		childEnds = []*os.File{inR, outW}
	}
	err := cmd.Start()
	for _, f := range childEnds {
		f.Close() // the child has its own copies now
	}
	if err != nil {
		p.closePipes()
		return nil, fmt.Errorf("process: start %s: %w", cfg.Argv[0], err)
	}
	go p.wait()
	return p, nil
}

// wait reaps the child. It is the only caller of cmd.Wait.
func (p *Process) wait() {
	p.waitErr = p.cmd.Wait()
	close(p.done)
}

// PID returns the child's process id, which is also its process group id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the child has exited, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// Done is closed when the child has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop sends SIGTERM to the child's process group, then SIGKILL if the child
// has not exited within a grace period, and waits for it and, within a bound,
// for the rest of its group (forks that init reaps). It is safe to call more
// than once.
func (p *Process) Stop() {
	defer p.closePipes()
	select {
	case <-p.done:
	default:
		p.killGroup(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(termGrace):
			p.killGroup(syscall.SIGKILL)
			select {
			case <-p.done:
			case <-time.After(killGrace):
			}
		}
	}
	p.killGroup(syscall.SIGKILL) // forks left behind, if any
	p.waitGroupGone(groupGrace)
}

func (p *Process) closePipes() {
	for _, f := range []*os.File{p.Stdin, p.Stdout} {
		if f != nil {
			f.Close()
		}
	}
}

// LogTail returns the last lines of the child's log, for error messages.
func (p *Process) LogTail() string {
	if p.log == "" {
		return ""
	}
	b, err := os.ReadFile(p.log)
	if err != nil {
		return ""
	}
	b = bytes.TrimSpace(b)
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.ReplaceAll(string(b), "\n", " | ")
}
