package source

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	sigsyaml "sigs.k8s.io/yaml"
)

// reports records what refusals report, one line each: "E " or "I ",
// the message, then the key/value pairs.
type reports struct {
	mu    sync.Mutex // guards lines
	lines []string
}

func (r *reports) report(err error, msg string, kv ...any) {
	var b strings.Builder
	b.WriteString("I ")
	if err != nil {
		b.Reset()
		b.WriteString("E ")
	}
	b.WriteString(msg)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, b.String())
}

func (r *reports) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines)
}

// forbidden is the API server's 403 for verb on resource.
func forbidden(verb, resource string) error {
	return apierrors.NewForbidden(schema.GroupResource{Resource: resource}, "",
		fmt.Errorf("User \"kup\" cannot %s resource %q in API group \"\" at the cluster scope", verb, resource))
}

// TestRefusalsReportWhatPersists: a 403 is reported as an RBAC problem
// only when a retry refusalPersists or more later is refused too, with
// nothing else between; a refusal that clears sooner is said to have been
// a passing one; a reported one that clears is said to; a later one that
// persists is reported again.
func TestRefusalsReportWhatPersists(t *testing.T) {
	type step struct {
		after time.Duration // since the previous step
		event string        // "list", "watch" (refused), "listed", "watched", "other" (another error)
		want  []string      // what is reported, in part
	}
	cases := []struct {
		name   string
		synced bool
		steps  []step
	}{{
		name: "a watch refused for a moment, as by a restarted API server",
		steps: []step{
			{0, "watch", nil},
			{800 * time.Millisecond, "listed", nil},
			{0, "watch", nil},
			{1600 * time.Millisecond, "listed", nil},
			{0, "watched", []string{"I The API server refused for a moment what it allows now", "verb=watch for=2s"}},
		},
	}, {
		name: "a watch refused for good, then allowed, then refused again",
		steps: []step{
			{0, "watch", nil},
			{time.Second, "listed", nil},
			{0, "watch", nil},
			{2 * time.Second, "watch", nil},
			{4 * time.Second, "watch", nil},
			{3 * time.Second, "watch", []string{"E The API server lets the proxy list but not watch", "resource=services apiGroup= verbs=list,watch for=10s"}},
			{20 * time.Second, "listed", nil},
			{0, "watch", nil},
			{40 * time.Second, "watched", []string{"I The API server lets the proxy watch again", "after=1m10s"}},
			{5 * time.Minute, "watch", nil},
			{30 * time.Second, "watch", []string{"E The API server lets the proxy list but not watch", "for=30s"}},
		},
	}, {
		name: "a list refused for good before the first sync, then allowed",
		steps: []step{
			{0, "list", nil},
			{9 * time.Second, "list", nil},
			{12 * time.Second, "list", []string{"E The API server forbids reading what the proxy needs; nothing is served until RBAC allows it", "verbs=list,watch for=21s"}},
			{time.Minute, "list", nil},
			{time.Second, "listed", []string{"I The API server lets the proxy read again what it forbade", "after=1m22s"}},
		},
	}, {
		name:   "a list refused for good after the first sync",
		synced: true,
		steps: []step{
			{0, "list", nil},
			{45 * time.Second, "list", []string{"E The API server forbids reading what the proxy needs; what is served stays as it is until RBAC allows it"}},
			{time.Second, "watched", []string{"I The API server lets the proxy read again"}},
		},
	}, {
		name: "another error between two refusals: they do not add up",
		steps: []step{
			{0, "watch", nil},
			{8 * time.Second, "other", nil},
			{8 * time.Second, "watch", nil},
			{9 * time.Second, "watch", nil},
			{time.Second, "watch", []string{"E The API server lets the proxy list but not watch", "for=10s"}},
			{time.Second, "other", nil},
			{time.Second, "watched", []string{"I The API server lets the proxy watch again", "after=12s"}},
		},
	}, {
		name: "a list that works does not clear a refused watch",
		steps: []step{
			{0, "watch", nil},
			{10 * time.Second, "listed", nil},
			{0, "watch", []string{"E The API server lets the proxy list but not watch"}},
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var got reports
				r := &refusals{resource: "services", unread: whyNothingServed, stale: whyServedStays,
					synced: func() bool { return tc.synced }, report: got.report}
				var want []string
				reported := 0
				for i, s := range tc.steps {
					time.Sleep(s.after)
					switch s.event {
					case "list", "watch":
						r.refused(forbidden(s.event, "services"))
					case "listed":
						r.listed()
					case "watched":
						r.watched()
					case "other":
						r.failed()
					}
					want = append(want, s.want...)
					if len(s.want) > 0 {
						reported++
					}
					all := got.get()
					lines := strings.Join(all, "\n")
					n := 0
					for _, w := range want {
						if strings.Contains(lines, w) {
							n++
						}
					}
					if n != len(want) || len(all) != reported {
						t.Fatalf("after step %d (%s): reports\n%s\nwant ones containing %q", i, s.event, lines, want)
					}
				}
			})
		})
	}
}

// TestClusterReportsOnlyPersistingWatchRefusals runs a Cluster whose
// Services may be listed but, for a while, not watched: refused for less
// than refusalPersists, nothing is reported as an RBAC problem; refused
// longer, it is, with the verbs the deploy ClusterRole grants, and said to
// work again once a watch is accepted; refused again later, after the
// watch ended, it is reported again.
func TestClusterReportsOnlyPersistingWatchRefusals(t *testing.T) {
	// As in TestClusterWaitsForBothCaches: HandleError's rate limiter
	// would put the refused reflector to sleep for decades of fake time.
	saved := utilruntime.ErrorHandlers
	utilruntime.ErrorHandlers = saved[:1:1]
	t.Cleanup(func() { utilruntime.ErrorHandlers = saved })
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(service("web"), webSlice("1", "10.0.0.1"))
		var refuse atomic.Bool
		var mu sync.Mutex // guards open
		var open *watch.RaceFreeFakeWatcher
		client.PrependWatchReactor("services", func(k8stesting.Action) (bool, watch.Interface, error) {
			if refuse.Load() {
				return true, nil, forbidden("watch", "services")
			}
			mu.Lock()
			defer mu.Unlock()
			open = watch.NewRaceFreeFake()
			return true, open, nil
		})
		var got reports
		refuse.Store(true)
		r := runCluster(t, client, func(c *Cluster) { c.report = got.report })

		time.Sleep(5 * time.Second)
		synctest.Wait()
		refuse.Store(false)
		for range 90 {
			settle()
		}
		lines := got.get()
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "I The API server refused for a moment") {
			t.Fatalf("a watch refused for 5 s: reports %q, want one saying it passed", lines)
		}
		if n, _, _ := r.counts(); n == 0 {
			t.Fatal("nothing applied")
		}

		refuse.Store(true)
		mu.Lock()
		open.Stop() // the API server ends the watch; the next is refused
		mu.Unlock()
		for range 60 {
			settle()
		}
		lines = got.get()[1:]
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "E The API server lets the proxy list but not watch") ||
			!strings.Contains(lines[0], "resource=services apiGroup= verbs=list,watch") {
			t.Fatalf("a watch refused for a minute: reports %q, want one saying so with verbs=list,watch", lines)
		}
		refuse.Store(false)
		for range 90 {
			settle()
		}
		lines = got.get()[1:]
		if len(lines) != 2 || !strings.HasPrefix(lines[1], "I The API server lets the proxy watch again") {
			t.Fatalf("a watch accepted again: reports %q, want it said", lines)
		}

		refuse.Store(true)
		mu.Lock()
		open.Stop()
		mu.Unlock()
		for range 60 {
			settle()
		}
		lines = got.get()[3:]
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "E The API server lets the proxy list but not watch") {
			t.Fatalf("a watch refused again later: reports %q, want it reported again", lines)
		}
		r.stop()
	})
}

// TestGrantedVerbsAreTheDeployRole: the verbs a refusal's hint names are
// those the ClusterRole of deploy/kube-userspace-proxy.yaml grants.
func TestGrantedVerbsAreTheDeployRole(t *testing.T) {
	data, err := os.ReadFile("../deploy/kube-userspace-proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	yr := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := yr.Read()
		if err != nil {
			break
		}
		var role rbacv1.ClusterRole
		if sigsyaml.Unmarshal(doc, &role) != nil || role.Kind != "ClusterRole" {
			continue
		}
		for _, rule := range role.Rules {
			for _, res := range rule.Resources {
				got[res] = strings.Join(rule.Verbs, ",")
			}
		}
	}
	if len(got) == 0 {
		t.Fatal("no ClusterRole in deploy/kube-userspace-proxy.yaml")
	}
	if !maps.Equal(got, grantedVerbs) {
		t.Errorf("the deploy ClusterRole grants %v; grantedVerbs says %v", got, grantedVerbs)
	}
}

// TestClusterSaysCredentialsWorkAgain: when the API server stops
// accepting the proxy's credentials (a token expired), that is said once,
// however often client-go retries; once a watch works again that is said
// too, and a later rejection is said again, where it used to be said once
// per process.
func TestClusterSaysCredentialsWorkAgain(t *testing.T) {
	saved := utilruntime.ErrorHandlers
	utilruntime.ErrorHandlers = saved[:1:1]
	t.Cleanup(func() { utilruntime.ErrorHandlers = saved })
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(service("web"), webSlice("1", "10.0.0.1"))
		var reject atomic.Bool
		var mu sync.Mutex // guards open
		var open *watch.RaceFreeFakeWatcher
		// Services' lists are rejected too, as every request is; the
		// other informers go on, which the fake cannot reject alike.
		client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
			if reject.Load() {
				return true, nil, apierrors.NewUnauthorized("token expired")
			}
			return false, nil, nil
		})
		client.PrependWatchReactor("services", func(k8stesting.Action) (bool, watch.Interface, error) {
			if reject.Load() {
				return true, nil, apierrors.NewUnauthorized("token expired")
			}
			mu.Lock()
			defer mu.Unlock()
			open = watch.NewRaceFreeFake()
			return true, open, nil
		})
		var got reports
		r := runCluster(t, client, func(c *Cluster) { c.report = got.report })
		rejectFor := func() {
			reject.Store(true)
			mu.Lock()
			if open != nil {
				open.Stop() // the API server ends the watch; the next is rejected
			}
			mu.Unlock()
			for range 60 {
				settle()
			}
		}
		const said = "E The API server does not accept the proxy's credentials"
		rejectFor()
		if lines := got.get(); len(lines) != 1 || !strings.HasPrefix(lines[0], said) {
			t.Fatalf("credentials rejected for a minute: reports %q, want one saying so", lines)
		}
		reject.Store(false)
		for range 90 {
			settle()
		}
		if lines := got.get(); len(lines) != 2 || lines[1] != "I The API server accepts the proxy's credentials again" {
			t.Fatalf("credentials accepted again: reports %q, want it said", lines)
		}
		rejectFor()
		if lines := got.get(); len(lines) != 3 || !strings.HasPrefix(lines[2], said) {
			t.Fatalf("credentials rejected again: reports %q, want it said again", lines)
		}
		r.stop()
	})
}
