package source

import (
	"net/http"
	"sync"
	"time"
)

// contactReminder is how often, while the API server stays unreachable,
// the log says so again.
const contactReminder = time.Minute

// contact watches the client's requests and logs when the API server stops
// answering and when it answers again. client-go retries a refused
// connection without a word at the default verbosity, backing off for up
// to a minute between attempts; without this, a proxy cut off from its
// cluster, serving what it last heard, would look like a healthy one.
//
// Only requests that get no answer at all count: an HTTP error status is
// an answer, and client-go reports those itself.
type contact struct {
	now    func() time.Time
	report func(err error, msg string, kv ...any) // err is nil for good news
	// hint, if set, is added to every report of an outage.
	hint string

	mu           sync.Mutex // guards the fields below
	downSince    time.Time  // zero while the server answers
	failures     int        // requests without an answer since downSince
	reported     time.Time  // when the outage was last logged
	everAnswered bool       // the server has answered once
}

// inClusterHint says why a proxy using the in-cluster configuration may
// never reach its API server.
const inClusterHint = "the in-cluster configuration reaches the API server at $KUBERNETES_SERVICE_HOST, usually the cluster IP of Service default/kubernetes, which only this proxy serves, and only after its first sync: " +
	"give --kubeconfig (or clientConnection.kubeconfig) or --master with the API server's own address, or set KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT to it"

func newContact(hint string) *contact {
	return &contact{hint: hint, now: time.Now, report: logReport}
}

// wrap is a rest.Config transport wrapper.
func (c *contact) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		switch {
		case err == nil:
			c.answered()
		case req.Context().Err() == nil: // not a request given up on by its caller
			c.failed(req.URL.Host, err)
		}
		return resp, err
	})
}

func (c *contact) failed(server string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	c.failures++
	var kv []any
	if c.hint != "" {
		kv = []any{"hint", c.hint}
	}
	switch {
	case c.downSince.IsZero():
		c.downSince, c.failures, c.reported = now, 1, now
		msg := "Cannot reach the API server; what is served stays as it is until it answers"
		if !c.everAnswered {
			msg = "Cannot reach the API server; nothing is served until it answers"
		}
		c.report(err, msg, append([]any{"server", server}, kv...)...)
	case now.Sub(c.reported) >= contactReminder:
		c.reported = now
		c.report(err, "Still cannot reach the API server", append([]any{"server", server,
			"for", now.Sub(c.downSince).Round(time.Second), "failedRequests", c.failures}, kv...)...)
	}
}

func (c *contact) answered() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.everAnswered = true
	if c.downSince.IsZero() {
		return
	}
	c.report(nil, "The API server answers again; the informers now list what changed meanwhile, which client-go may put off for up to a minute", "after", c.now().Sub(c.downSince).Round(time.Second), "failedRequests", c.failures)
	c.downSince, c.failures = time.Time{}, 0
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
