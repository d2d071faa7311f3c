//go:build integration && linux

package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/source"
)

// serviceCIDR is the API server's --service-cluster-ip-range. Endpoints in
// the tests use 198.19.0.0/16, outside it; neither range is ever sent to
// from the host's network namespace.
const serviceCIDR = "198.18.0.0/16"

// adminToken authenticates as a member of system:masters.
const adminToken = "kup-integration-admin"

// limitedToken authenticates as limitedUser, who may do only what RBAC
// objects a test creates allow. A test that runs in parallel with another
// that grants limitedUser roles has a user of its own (listOnlyUser): the
// other's grants would be its too.
const (
	limitedToken  = "kup-integration-limited"
	limitedUser   = "kup-limited"
	listOnlyToken = "kup-integration-list-only"
	listOnlyUser  = "kup-list-only"
)

// apiServer is an etcd and a kube-apiserver on loopback, shared by the
// package's tests: started by the first test that needs it, stopped by
// TestMain.
type apiServer struct {
	dir        string
	Kubeconfig string // admin credentials
	URL        string // https://127.0.0.1:port
	EtcdURL    string // http://127.0.0.1:port
	Client     kubernetes.Interface

	ca            []byte // the API server's certificate bundle
	apiserverBin  string
	apiserverArgs []string

	mu        sync.Mutex // guards the fields below
	etcd      *process
	apiserver *process
}

var (
	sharedAPIOnce sync.Once
	sharedAPI     *apiServer
	sharedAPIErr  error
	// sharedAPISkip is set when the binaries could not be built outside
	// CI: tests skip rather than fail.
	sharedAPISkip bool
)

// requireAPIServer returns the shared API server, starting it on first
// use. When its binaries are missing and cannot be built, the test skips,
// except under CI=true, where it fails.
func requireAPIServer(t *testing.T) *apiServer {
	t.Helper()
	sharedAPIOnce.Do(func() {
		sharedAPI, sharedAPISkip, sharedAPIErr = startAPIServer()
	})
	if sharedAPIErr != nil {
		if sharedAPISkip && os.Getenv("CI") != "true" {
			t.Skipf("no kube-apiserver: %v", sharedAPIErr)
		}
		t.Fatalf("kube-apiserver: %v", sharedAPIErr)
	}
	return sharedAPI
}

// stopAPIServer stops the shared API server, if one was started. TestMain
// calls it after the tests.
func stopAPIServer() {
	if sharedAPI != nil {
		sharedAPI.close()
	}
}

// kubeBinaries runs hack/kube-tools.sh, which builds etcd and
// kube-apiserver into its cache unless they are there already, and returns
// their paths.
func kubeBinaries() (etcd, apiserver string, err error) {
	cmd := exec.Command("../hack/kube-tools.sh")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("hack/kube-tools.sh: %w\n%s", err, stderr.String())
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		switch k, v, _ := strings.Cut(line, "="); k {
		case "ETCD":
			etcd = v
		case "KUBE_APISERVER":
			apiserver = v
		}
	}
	if etcd == "" || apiserver == "" {
		return "", "", fmt.Errorf("hack/kube-tools.sh printed no paths:\n%s", stdout.String())
	}
	return etcd, apiserver, nil
}

// startAPIServer starts etcd and kube-apiserver on loopback ports, waits
// until the API server is ready and writes an admin kubeconfig. skip is
// true when the binaries are what is missing.
func startAPIServer() (api *apiServer, skip bool, err error) {
	etcdBin, apiserverBin, err := kubeBinaries()
	if err != nil {
		return nil, true, err
	}
	dir, err := os.MkdirTemp("", "kup-apiserver-")
	if err != nil {
		return nil, false, err
	}
	a := &apiServer{dir: dir, apiserverBin: apiserverBin}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	ports, err := freeTCPPorts(3)
	if err != nil {
		return nil, false, err
	}
	etcdPort, peerPort, apiPort := ports[0], ports[1], ports[2]
	a.EtcdURL = fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	a.URL = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)

	a.etcd, err = startProcess(filepath.Join(dir, "etcd.log"), etcdBin,
		"--name", "kup",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", a.EtcdURL,
		"--advertise-client-urls", a.EtcdURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "kup="+peerURL,
		"--unsafe-no-fsync",
		"--log-level", "warn",
	)
	if err != nil {
		return nil, false, fmt.Errorf("start etcd: %w", err)
	}
	plain := func() (*http.Client, error) { return &http.Client{Timeout: 5 * time.Second}, nil }
	if err := waitReady(plain, a.EtcdURL+"/readyz", "", a.etcd, 30*time.Second); err != nil {
		return nil, false, fmt.Errorf("etcd: %w", err)
	}

	saKey := filepath.Join(dir, "sa.key")
	tokens := filepath.Join(dir, "tokens.csv")
	if err := writeServiceAccountKey(saKey); err != nil {
		return nil, false, err
	}
	users := adminToken + `,admin,admin,"system:masters"` + "\n"
	for _, u := range [][2]string{{limitedToken, limitedUser}, {listOnlyToken, listOnlyUser}} {
		users += u[0] + "," + u[1] + "," + u[1] + "\n"
	}
	if err := os.WriteFile(tokens, []byte(users), 0o600); err != nil {
		return nil, false, err
	}
	certDir := filepath.Join(dir, "certs")
	a.apiserverArgs = []string{
		"--etcd-servers", a.EtcdURL,
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(apiPort),
		"--cert-dir", certDir,
		"--token-auth-file", tokens,
		"--authorization-mode", "RBAC",
		"--service-cluster-ip-range", serviceCIDR,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey,
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v", "1",
	}
	if err := a.startAPIServerProcess(); err != nil {
		return nil, false, err
	}
	if err := a.writeKubeconfig(filepath.Join(certDir, "apiserver.crt")); err != nil {
		return nil, false, err
	}
	a.Client, err = source.NewClient(a.Kubeconfig, "", 1000, 2000, "application/vnd.kubernetes.protobuf", "")
	if err != nil {
		return nil, false, err
	}
	return a, false, nil
}

// startAPIServerProcess starts kube-apiserver and waits until /readyz
// answers ok.
func (a *apiServer) startAPIServerProcess() error {
	p, err := startProcess(filepath.Join(a.dir, "apiserver.log"), a.apiserverBin, a.apiserverArgs...)
	if err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	a.mu.Lock()
	a.apiserver = p
	a.mu.Unlock()
	// The API server writes its self-signed certificate bundle when it
	// starts; trust it once it is there.
	ca := filepath.Join(a.dir, "certs", "apiserver.crt")
	client := func() (*http.Client, error) {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", ca)
		}
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool},
		}}, nil
	}
	if err := waitReady(client, a.URL+"/readyz", adminToken, p, 90*time.Second); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	return nil
}

// StopAPIServer stops kube-apiserver, leaving etcd running, so a test can
// see what clients do while it is away.
func (a *apiServer) StopAPIServer() {
	a.mu.Lock()
	p := a.apiserver
	a.apiserver = nil
	a.mu.Unlock()
	if p != nil {
		p.stop()
	}
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same port and etcd.
func (a *apiServer) StartAPIServer() error { return a.startAPIServerProcess() }

func (a *apiServer) close() {
	a.StopAPIServer()
	a.mu.Lock()
	etcd := a.etcd
	a.etcd = nil
	a.mu.Unlock()
	if etcd != nil {
		etcd.stop()
	}
	if a.dir != "" {
		os.RemoveAll(a.dir)
	}
}

// writeKubeconfig writes an admin kubeconfig trusting the API server's
// self-signed certificate bundle.
func (a *apiServer) writeKubeconfig(caFile string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	a.ca = ca
	a.Kubeconfig = filepath.Join(a.dir, "kubeconfig")
	return a.kubeconfigFor(adminToken, a.Kubeconfig)
}

// kubeconfigFor writes a kubeconfig that authenticates with token to path.
func (a *apiServer) kubeconfigFor(token, path string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kup"] = &clientcmdapi.Cluster{Server: a.URL, CertificateAuthorityData: a.ca}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kup"] = &clientcmdapi.Context{Cluster: "kup", AuthInfo: "user"}
	cfg.CurrentContext = "kup"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	return nil
}

// PutEtcd writes obj straight into etcd under the API server's key for
// it, encoded as the API server stores it (protobuf behind the "k8s\x00"
// magic), bypassing the API server's validation. The API server's watch
// cache then serves it to watchers as it is.
func (a *apiServer) PutEtcd(ctx context.Context, resource string, gv schema.GroupVersion, obj kruntime.Object, namespace, name string) error {
	var buf bytes.Buffer
	enc := scheme.Codecs.EncoderForVersion(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), gv)
	if err := enc.Encode(obj, &buf); err != nil {
		return fmt.Errorf("etcd put: encode: %w", err)
	}
	key := fmt.Sprintf("/registry/%s/%s/%s", resource, namespace, name)
	// etcd's gRPC gateway takes JSON with base64 bytes.
	body, err := json.Marshal(map[string]string{
		"key":   base64.StdEncoding.EncodeToString([]byte(key)),
		"value": base64.StdEncoding.EncodeToString(buf.Bytes()),
	})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.EtcdURL+"/v3/kv/put", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("etcd put %s: %w", key, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd put %s: %s: %s", key, resp.Status, msg)
	}
	return nil
}

// process is a child process that logs to a file.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed once it has exited
	err  error
}

// startProcess starts name with args, its output going to logFile. The
// child gets SIGKILL if the test binary dies without stopping it.
func startProcess(logFile, name string, args ...string) (*process, error) {
	out, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child has its own copy
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	killWithParent(cmd)
	if err := spawn(cmd); err != nil {
		return nil, err
	}
	p := &process{name: filepath.Base(name), log: logFile, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM to the process (by its PID) and waits; SIGKILL after
// 15 s.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tail returns the end of the process's log.
func (p *process) tail() string {
	data, _ := os.ReadFile(p.log)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// spawnRequests feeds the goroutine that starts child processes. It is
// locked to its OS thread for the life of the test binary: Pdeathsig fires
// when the thread that forked a child exits, and the runtime ends threads
// that other tests lock (e.g. to enter a network namespace).
var (
	spawnOnce     sync.Once
	spawnRequests = make(chan spawnRequest)
)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the binary
			for r := range spawnRequests {
				r.done <- r.cmd.Start()
			}
		}()
	})
	r := spawnRequest{cmd: cmd, done: make(chan error, 1)}
	spawnRequests <- r
	return <-r.done
}

// waitReady polls url until it answers 200, p exits or timeout passes.
// client is called before every probe.
func waitReady(client func() (*http.Client, error), url, token string, p *process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before it was ready; log:\n%s", p.name, p.err, p.tail())
		default:
		}
		c, err := client()
		if err == nil {
			err = probe(c, url, token)
		}
		if err == nil {
			return nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within %v: %v; log:\n%s", url, timeout, last, p.tail())
}

func probe(c *http.Client, url, token string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, firstLines(string(body), 5))
	}
	return nil
}

func firstLines(s string, n int) string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for len(out) < n && sc.Scan() {
		out = append(out, sc.Text())
	}
	return strings.Join(out, " | ")
}

// freeTCPPorts returns n distinct ports free on 127.0.0.1 at the time of
// the call.
func freeTCPPorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// writeServiceAccountKey writes a fresh RSA key for signing service account
// tokens; nothing in the tests uses them, but the API server requires one.
func writeServiceAccountKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("service account key: %w", err)
	}
	return nil
}
