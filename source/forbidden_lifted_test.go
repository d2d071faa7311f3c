package source

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The lines refusals reports, whole, as reports records them.
const (
	forbidsReading = "E The API server forbids reading what the proxy needs; what is served stays as it is until RBAC allows it (deploy/kube-userspace-proxy.yaml has the ClusterRole) resource=services apiGroup= verbs=list,watch"
	listNotWatch   = "E The API server lets the proxy list but not watch; what is served follows lists client-go repeats up to a minute apart, so changes come late and cost the API server more, until RBAC allows watch (deploy/kube-userspace-proxy.yaml has the ClusterRole) resource=services apiGroup= verbs=list,watch"
	readAgain      = "I The API server lets the proxy read again what it forbade resource=services apiGroup="
	watchAgain     = "I The API server lets the proxy watch again; changes are served as they come resource=services apiGroup="
	forAMoment     = "I The API server refused for a moment what it allows now: a restarted API server does until it has loaded RBAC, or RBAC changed meanwhile resource=services apiGroup="
)

// TestRefusalsLiftedWithOneLine: a refusal that was reported, of the list
// or of the watch, is said to be lifted in exactly one line, however the
// refusals of the other verb fell around it; "for a moment" is said only
// of a refusal nobody was told about. The first case is what a restarted
// API server without the proxy's ClusterRoleBinding did: it refused the
// watch the informer resumed, then the lists that followed, and those were
// reported; once the binding was back, the watch refusal, never reported,
// was also said to have been a moment's, 77 s long.
func TestRefusalsLiftedWithOneLine(t *testing.T) {
	type step struct {
		after time.Duration // since the previous step
		event string        // "list", "watch" (refused), "listed", "watched"
	}
	cases := []struct {
		name  string
		steps []step
		want  []string // every line reported, whole
	}{{
		name: "a watch refused, then lists refused and reported, then both allowed",
		steps: []step{
			{0, "watch"},
			{42 * time.Second, "list"},
			{10 * time.Second, "list"},
			{23 * time.Second, "list"},
			{2 * time.Second, "listed"},
			{0, "watched"},
		},
		want: []string{forbidsReading + " for=10s", readAgain + " after=35s"},
	}, {
		name: "the same, allowed by a watch that lists (client-go's watch-list mode)",
		steps: []step{
			{0, "watch"},
			{42 * time.Second, "list"},
			{10 * time.Second, "list"},
			{25 * time.Second, "watched"},
		},
		want: []string{forbidsReading + " for=10s", readAgain + " after=35s"},
	}, {
		name: "a watch still refused once lists are allowed again is reported anew",
		steps: []step{
			{0, "watch"},
			{time.Second, "list"},
			{11 * time.Second, "list"},
			{8 * time.Second, "listed"},
			{0, "watch"},
			{11 * time.Second, "listed"},
			{0, "watch"},
			{9 * time.Second, "watched"},
		},
		want: []string{forbidsReading + " for=11s", readAgain + " after=19s", listNotWatch + " for=11s", watchAgain + " after=20s"},
	}, {
		name: "a watch refused and reported, then a list refused for a moment, then both allowed",
		steps: []step{
			{0, "watch"},
			{time.Second, "listed"},
			{0, "watch"},
			{12 * time.Second, "watch"},
			{30 * time.Second, "list"},
			{2 * time.Second, "listed"},
			{0, "watch"},
			{5 * time.Second, "listed"},
			{0, "watched"},
		},
		want: []string{listNotWatch + " for=13s", watchAgain + " after=50s"},
	}, {
		name: "the same, allowed by a watch that lists",
		steps: []step{
			{0, "watch"},
			{13 * time.Second, "watch"},
			{30 * time.Second, "list"},
			{2 * time.Second, "watched"},
		},
		want: []string{listNotWatch + " for=13s", watchAgain + " after=45s"},
	}, {
		name: "a watch refused and reported, then lists refused and reported, then both allowed",
		steps: []step{
			{0, "watch"},
			{12 * time.Second, "watch"},
			{time.Minute, "list"},
			{15 * time.Second, "list"},
			{20 * time.Second, "watched"},
		},
		want: []string{listNotWatch + " for=12s", forbidsReading + " for=15s", readAgain + " after=35s"},
	}, {
		name: "a watch and a list each refused for a moment, nothing reported",
		steps: []step{
			{0, "watch"},
			{800 * time.Millisecond, "list"},
			{1200 * time.Millisecond, "listed"},
			{0, "watched"},
		},
		want: []string{forAMoment + " verb=list for=1s", forAMoment + " verb=watch for=2s"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var got reports
				r := &refusals{resource: "services", unread: whyNothingServed, stale: whyServedStays,
					synced: func() bool { return true }, report: got.report}
				for _, s := range tc.steps {
					time.Sleep(s.after)
					switch s.event {
					case "list", "watch":
						r.refused(forbidden(s.event, "services"))
					case "listed":
						r.listed()
					case "watched":
						r.watched()
					}
				}
				if lines := got.get(); !slices.Equal(lines, tc.want) {
					t.Errorf("reports\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(tc.want, "\n"))
				}
			})
		})
	}
}

// TestClusterSaysAReadRefusalLiftedOnce runs a Cluster through what a
// restarted API server without the proxy's ClusterRoleBinding does to the
// Services informer: the watch it resumes is refused, then every list; once
// a grant lets it read again, that is said in one line, and the refused
// watch, part of the same refusal, is not said to have been a moment's.
func TestClusterSaysAReadRefusalLiftedOnce(t *testing.T) {
	// As in TestClusterWaitsForBothCaches: HandleError's rate limiter
	// would put the refused reflector to sleep for decades of fake time.
	saved := utilruntime.ErrorHandlers
	utilruntime.ErrorHandlers = saved[:1:1]
	t.Cleanup(func() { utilruntime.ErrorHandlers = saved })
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(service("web"), webSlice("1", "10.0.0.1"))
		var refuse atomic.Bool
		var mu sync.Mutex // guards open and verbs
		var open *watch.RaceFreeFakeWatcher
		var verbs []string // the verbs refused, in turn
		client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
			if refuse.Load() {
				mu.Lock()
				defer mu.Unlock()
				verbs = append(verbs, "list")
				return true, nil, forbidden("list", "services")
			}
			return false, nil, nil
		})
		client.PrependWatchReactor("services", func(k8stesting.Action) (bool, watch.Interface, error) {
			mu.Lock()
			defer mu.Unlock()
			if refuse.Load() {
				verbs = append(verbs, "watch")
				return true, nil, forbidden("watch", "services")
			}
			open = watch.NewRaceFreeFake()
			return true, open, nil
		})
		var got reports
		r := runCluster(t, client, func(c *Cluster) { c.report = got.report })
		settle()
		if n, _, _ := r.counts(); n == 0 {
			t.Fatal("nothing applied")
		}

		refuse.Store(true)
		mu.Lock()
		open.Stop() // the API server goes away; what it answers next is refused
		mu.Unlock()
		for range 60 {
			settle()
		}
		mu.Lock()
		refused := slices.Clone(verbs)
		mu.Unlock()
		if len(refused) < 3 || refused[0] != "watch" || slices.Contains(refused[1:], "watch") {
			t.Fatalf("refused %q, want a watch, then lists", refused)
		}
		const forbids = "E The API server forbids reading what the proxy needs; what is served stays as it is"
		if lines := got.get(); len(lines) != 1 || !strings.HasPrefix(lines[0], forbids) {
			t.Fatalf("lists refused for a minute: reports %q, want one saying reading is forbidden", lines)
		}

		refuse.Store(false)
		for range 90 {
			settle()
		}
		if lines := got.get(); len(lines) != 2 || !strings.HasPrefix(lines[1], readAgain+" after=") {
			t.Fatalf("reading allowed again: reports %q, want one more line, saying so", lines)
		}
		r.stop()
	})
}
