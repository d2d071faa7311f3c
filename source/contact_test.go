package source

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// report is one line contact logged.
type report struct {
	msg string
	err error
	kv  string
}

// TestContactReportsOutageAndReturn drives a real HTTP client through
// contact against a loopback server that stops and comes back: the first
// unanswered request is reported at once, later ones only once a minute,
// and the first answer after them once, with how long it took.
func TestContactReportsOutageAndReturn(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	serve := func(ln net.Listener) *http.Server {
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusForbidden) // an error status is still an answer
		})}
		go srv.Serve(ln)
		return srv
	}
	srv := serve(ln)
	t.Cleanup(func() { srv.Close() })

	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var reports []report
	c := newContact("")
	c.now = func() time.Time { return now }
	c.report = func(err error, msg string, kv ...any) {
		var b strings.Builder
		for i := 0; i+1 < len(kv); i += 2 {
			fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
		}
		reports = append(reports, report{msg: msg, err: err, kv: b.String()})
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.DisableKeepAlives = true // every request dials, as after a broken watch
	client := &http.Client{Transport: c.wrap(transport)}
	get := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/api", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	expect := func(step string, want ...string) {
		t.Helper()
		if len(reports) != len(want) {
			t.Fatalf("%s: %d reports, want %d: %+v", step, len(reports), len(want), reports)
		}
		for i, w := range want {
			if got := reports[i].msg + " " + reports[i].kv; !strings.Contains(got, w) {
				t.Errorf("%s: report %d is %q, want it to contain %q", step, i, got, w)
			}
		}
	}

	if err := get(context.Background()); err != nil {
		t.Fatal(err)
	}
	expect("server up")

	srv.Close()
	if err := get(context.Background()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("request to a closed port: %v, want connection refused", err)
	}
	expect("first failure", "Cannot reach the API server; what is served stays as it is")
	if !errors.Is(reports[0].err, syscall.ECONNREFUSED) || !strings.Contains(reports[0].kv, addr) {
		t.Errorf("the report names neither the error nor the server: %+v", reports[0])
	}

	now = now.Add(30 * time.Second)
	get(context.Background())
	expect("second failure within a minute", "Cannot reach")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	get(ctx) // given up by its caller: not the server's doing
	now = now.Add(31 * time.Second)
	get(context.Background())
	expect("a minute on", "Cannot reach", "Still cannot reach the API server")
	if kv := reports[1].kv; !strings.Contains(kv, "for=1m1s") || !strings.Contains(kv, "failedRequests=3") {
		t.Errorf("reminder says %q, want for 1m1s and 3 failed requests", kv)
	}

	ln, err = net.Listen("tcp4", addr)
	if err != nil {
		t.Fatalf("listen on %s again: %v", addr, err)
	}
	srv = serve(ln)
	t.Cleanup(func() { srv.Close() })
	now = now.Add(4 * time.Second)
	if err := get(context.Background()); err != nil {
		t.Fatal(err)
	}
	get(context.Background())
	expect("back", "Cannot reach", "Still cannot", "The API server answers again")
	if kv := reports[2].kv; !strings.Contains(kv, "after=1m5s") || !strings.Contains(kv, "failedRequests=3") {
		t.Errorf("recovery says %q, want after 1m5s and 3 failed requests", kv)
	}
	if reports[2].err != nil {
		t.Errorf("recovery reported as an error: %v", reports[2].err)
	}
}

// TestContactBeforeFirstAnswer: an API server that never answered is
// reported as such (nothing is served yet), with the hint, which the
// in-cluster configuration gives: it usually names a cluster IP that only
// this proxy serves.
func TestContactBeforeFirstAnswer(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody serves it: refused
	var got []string
	c := newContact(inClusterHint)
	c.report = func(err error, msg string, kv ...any) { got = append(got, fmt.Sprint(msg, kv)) }
	client := &http.Client{Transport: c.wrap(http.DefaultTransport.(*http.Transport).Clone())}
	if _, err := client.Get("http://" + addr + "/api"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("request to a closed port: %v, want connection refused", err)
	}
	if len(got) != 1 || !strings.Contains(got[0], "Cannot reach the API server; nothing is served until it answers") ||
		!strings.Contains(got[0], "KUBERNETES_SERVICE_HOST") || !strings.Contains(got[0], "--kubeconfig") {
		t.Errorf("reports %q; want one saying nothing is served, with the in-cluster hint", got)
	}
}
