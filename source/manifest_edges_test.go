package source

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/regularfile"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// problemStrings is what a parse of data reports, warnings then errors,
// each as its message.
func problemStrings(data string) (warnings, errs []string) {
	_, _, ws, err := ParseManifests("demo.yaml", []byte(data))
	for _, w := range ws {
		warnings = append(warnings, w.Error())
	}
	for _, e := range flatten(err) {
		errs = append(errs, e.Error())
	}
	return warnings, errs
}

// TestNearKindEdges: a kind is taken for a misspelt Service or
// EndpointSlice whatever its case, and two letters off in any way (two
// left out included), but not three: that is another kind, skipped with a
// warning.
func TestNearKindEdges(t *testing.T) {
	for _, tc := range []struct {
		name, apiVersion, kind string
		want                   string // the error; "" for a warning
	}{
		{"all capitals", "v1", "SERVICE", `kind: "SERVICE" is not a kind; did you mean Service?`},
		{"all lower case, long", "discovery.k8s.io/v1", "ENDPOINTSLICE", `kind: "ENDPOINTSLICE" is not a kind; did you mean EndpointSlice?`},
		{"two letters left out", "discovery.k8s.io/v1", "EndpontSlce", `kind: "EndpontSlce" is not a kind; did you mean EndpointSlice?`},
		{"three letters off", "example.com/v1", "Servers", ""},
		// Only in the groups the proxy reads: elsewhere such a kind is
		// another resource.
		{"another group's Service", "serving.knative.dev/v1", "Service", ""},
		{"another group's kind two letters off", "devices.kubeedge.io/v1beta1", "Device", ""},
		{"a group two letters off", "discovery.k8s.oi/v1", "EndpointSlice", `apiVersion: "discovery.k8s.oi/v1" is not a version of EndpointSlice this proxy reads: want discovery.k8s.io/v1 (kubectl refuses it too)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := "apiVersion: " + tc.apiVersion + "\nkind: " + tc.kind + "\nmetadata: {name: web}\n"
			warnings, errs := problemStrings(data)
			if tc.want == "" {
				want := `demo.yaml: document 1 (` + tc.kind + ` default/web): apiVersion "` + tc.apiVersion + `" kind "` + tc.kind + `" is not a Service or EndpointSlice; skipped`
				if len(errs) != 0 || !slices.Equal(warnings, []string{want}) {
					t.Fatalf("warnings %q, errors %q; want only the warning %q", warnings, errs, want)
				}
				return
			}
			want := "demo.yaml: document 1 (" + tc.kind + " default/web): " + tc.want
			if len(warnings) != 0 || !slices.Equal(errs, []string{want}) {
				t.Fatalf("warnings %q, errors %q; want only the error %q", warnings, errs, want)
			}
		})
	}
}

// TestListItemsEdges: what is inside a List is named by its item, in a
// ServiceList too, and in "duplicate of" when the first copy is the item; a
// List is refused inside a List wherever it is, the first item included.
func TestListItemsEdges(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       []string // exactly these errors, in this order
	}{
		{
			name: "an error in a ServiceList item",
			data: "apiVersion: v1\nkind: ServiceList\nitems:\n- metadata: {name: a}\n  spec: {ports: [{port: 80}]}\n" +
				"- metadata: {name: b}\n  spec: {ports: [{port: 0}]}\n",
			want: []string{"demo.yaml: document 1 (Service default/b): items[1].spec.ports[0].port: 0 is out of range 1-65535"},
		},
		{
			name: "an error in an EndpointSliceList item",
			data: "apiVersion: discovery.k8s.io/v1\nkind: EndpointSliceList\nitems:\n" +
				"- metadata: {name: a, labels: {kubernetes.io/service-name: web}}\n  addressType: IPv4\n" +
				"- metadata: {name: b, labels: {kubernetes.io/service-name: web}}\n  addressType: IPv9\n",
			want: []string{`demo.yaml: document 1 (EndpointSlice default/b): items[1].addressType: unknown address type "IPv9" (want IPv4 or IPv6)`},
		},
		{
			name: "a List as the first item of a List",
			data: "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: List, items: []}\n",
			want: []string{"demo.yaml: document 1 (List): items[0]: a List may not hold another list"},
		},
		{
			name: "a duplicate of a List's item",
			data: "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: web}, spec: {ports: [{port: 80}]}}\n---\n" +
				"apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 81}]}\n",
			want: []string{"demo.yaml: document 2 (Service default/web): duplicate of document 1 items[0]"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, errs := problemStrings(tc.data); !slices.Equal(errs, tc.want) {
				t.Fatalf("errors:\ngot  %q\nwant %q", errs, tc.want)
			}
		})
	}
}

// TestDuplicatedKeysNameTheFirstLine: a document with two duplicated keys
// is one error naming both lines, and its Line (where an editor jumps) is
// the first's.
func TestDuplicatedKeysNameTheFirstLine(t *testing.T) {
	data := "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  ports:\n  - port: 80\n    port: 81\n" +
		"  - port: 82\n    name: a\n    name: b\n"
	_, _, _, err := ParseManifests("demo.yaml", []byte(data))
	errs := flatten(err)
	var oe *ObjectError
	if len(errs) != 1 || !errors.As(errs[0], &oe) {
		t.Fatalf("got %v, want one ObjectError", err)
	}
	if oe.Line != 7 || !strings.Contains(oe.Error(), "line 7: ") || !strings.Contains(oe.Error(), "line 10: ") {
		t.Fatalf("got %v (line %d), want line 7, naming lines 7 and 10", oe, oe.Line)
	}
}

// TestErrorsInFileOrder: the errors of a file come in the order of the
// file, those the checks across objects find (a node port used twice, in
// document 2) among the others (a bad port in document 3), not after them.
func TestErrorsInFileOrder(t *testing.T) {
	data := "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {type: NodePort, ports: [{port: 80, nodePort: 30080}]}\n---\n" +
		"apiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {type: NodePort, ports: [{port: 81, nodePort: 30080}]}\n---\n" +
		"apiVersion: v1\nkind: Service\nmetadata: {name: c}\nspec: {ports: [{port: 0}]}\n"
	_, _, _, err := ParseManifests("demo.yaml", []byte(data))
	var docs []int
	for _, e := range flatten(err) {
		var oe *ObjectError
		if !errors.As(e, &oe) {
			t.Fatalf("%v: not an ObjectError", e)
		}
		docs = append(docs, oe.Document)
	}
	if !slices.Equal(docs, []int{2, 3}) {
		t.Fatalf("errors of documents %v, want [2 3]: %v", docs, err)
	}
}

// TestDocCacheEdges: what a read reuses from the last is kept for the next
// in turn, so a file read three times decodes its unchanged documents
// once; and only the kinds the proxy serves are kept, not a ConfigMap it
// skips.
func TestDocCacheEdges(t *testing.T) {
	data := []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n---\n" +
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {a: b}\n")
	first, err := parseManifests(context.Background(), "demo.yaml", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.docs) != 1 {
		t.Fatalf("first read keeps %d documents, want the Service's alone", len(first.docs))
	}
	second, err := parseManifests(context.Background(), "demo.yaml", data, first.docs)
	if err != nil {
		t.Fatal(err)
	}
	if len(second.docs) != 1 {
		t.Fatalf("second read keeps %d documents for the next, want the one it reused", len(second.docs))
	}
	for key, d := range second.docs {
		if first.docs[key].obj != d.obj {
			t.Fatal("second read decoded the unchanged Service again")
		}
	}
}

// TestFieldLineEdges: a field whose value starts on the next line (a block
// map) is on its key's line; an index past the end of a list gives the
// list's line; a document of nothing has no line; and two documents of the
// same length are each walked as themselves, not as the one parsed before.
func TestFieldLineEdges(t *testing.T) {
	doc := []byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  labels:\n    app: web\nspec:\n  ports:\n  - port: 80\n  - port: 81\n")
	var c fieldLines
	for field, want := range map[string]int{
		"metadata.labels":     5,
		"metadata.labels.app": 6,
		"spec.ports":          8,
		"spec.ports[1]":       10,
		"spec.ports[2].port":  8,
		"spec.ports[-1]":      8,
		"spec.nothing":        7,
	} {
		if got := c.fieldLine(doc, field); got != want {
			t.Errorf("%s: line %d, want %d", field, got, want)
		}
	}

	if got := c.fieldLine([]byte("# nothing\n"), "spec"); got != 0 {
		t.Errorf("a document of a comment: line %d, want 0", got)
	}

	a := []byte("a: 1\nb:\n  c: 2\n")
	b := []byte("b:\n  c: 2\na: 1\n")
	if len(a) != len(b) {
		t.Fatal("the two documents must be of one length")
	}
	if got := c.fieldLine(a, "b.c"); got != 3 {
		t.Errorf("first document: b.c on line %d, want 3", got)
	}
	if got := c.fieldLine(b, "b.c"); got != 2 {
		t.Errorf("second document of the same length: b.c on line %d, want 2", got)
	}
}

// TestIsExhausted: the errors of a process or host out of descriptors or
// memory are read again, not a broken edit; others are not.
func TestIsExhausted(t *testing.T) {
	for errno, want := range map[syscall.Errno]bool{
		syscall.EMFILE: true, syscall.ENFILE: true, syscall.ENOMEM: true, syscall.ENOBUFS: true,
		syscall.ENOENT: false, syscall.EACCES: false, syscall.EISDIR: false,
	} {
		err := &os.PathError{Op: "open", Path: "demo.yaml", Err: errno}
		if got := isExhausted(err); got != want {
			t.Errorf("%v: isExhausted %v, want %v", err, got, want)
		}
	}
}

// TestReadManifestSizeLimit: a file of some megabytes reads whole; one
// over 64 MiB is refused, naming the limit, without being read.
func TestReadManifestSizeLimit(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml")
	data := generatedManifest(2000, 5)
	if len(data) < 1<<20 {
		t.Fatalf("generated %d bytes, want over 1 MiB", len(data))
	}
	if err := os.WriteFile(big, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := readManifest(big); err != nil || len(got) != len(data) {
		t.Fatalf("read %d of %d bytes: %v", len(got), len(data), err)
	}

	huge := filepath.Join(dir, "huge.yaml")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(maxManifestBytes + 1) // sparse: no 64 MiB written
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if maxManifestBytes != 64<<20 {
		t.Errorf("limit %d, want 64 MiB", maxManifestBytes)
	}
	_, err = readManifest(huge)
	var refused *regularfile.RefusedError
	if !errors.As(err, &refused) || refused.Limit != 64<<20 {
		t.Fatalf("got %v, want a RefusedError at 64 MiB", err)
	}
}

// TestLoaderStatChanged: the poll sees the file appear and go, and a
// change of size even where the modification time was put back.
func TestLoaderStatChanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.yaml")
	l := &loader{path: path}
	step := func(what string, want bool) {
		t.Helper()
		if got := l.statChanged(); got != want {
			t.Fatalf("%s: statChanged %v, want %v", what, got, want)
		}
	}
	step("no file, as before", false)
	if err := os.WriteFile(path, []byte("a: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	step("the file appears", true)
	step("the file unchanged", false)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("a: 1\nb: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	step("written in place, longer, with its time put back", true)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	step("the file goes", true)
	step("still gone", false)
}

// TestLoaderRelevant: an event on the path, on its resolved target in
// another directory, or on a ConfigMap volume's "..data" swap may change
// the file; one on another file of either directory does not.
func TestLoaderRelevant(t *testing.T) {
	l := &loader{path: "/etc/proxy/demo.yaml", dir: "/etc/proxy", target: "/srv/real/demo.yaml"}
	for name, want := range map[string]bool{
		"/etc/proxy/demo.yaml":     true,
		"/etc/proxy/./demo.yaml":   true,
		"/srv/real/demo.yaml":      true,
		"/etc/proxy/..data":        true,
		"/etc/proxy/..data_tmp":    true,
		"/etc/proxy/other.yaml":    false,
		"/etc/proxy/.demo.yaml.sw": false,
		"/srv/real/other.yaml":     false,
		"/srv/real/..data":         false,
	} {
		if got := l.relevant(fsnotify.Event{Name: name, Op: fsnotify.Write}); got != want {
			t.Errorf("%s: relevant %v, want %v", name, got, want)
		}
	}
}

// TestLoaderRewatch: once the file's directory is replaced, moved aside
// or deleted, and made again, the poll watches the new one, whose events
// then come. A directory deleted and made again often gets the inode
// number of the old one back, so it looks like the one watched; but the
// watch ended with the old one.
func TestLoaderRewatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		gone func(dir string) error
	}{
		{"moved aside", func(dir string) error { return os.Rename(dir, dir+".old") }},
		{"deleted", os.RemoveAll},
	} {
		t.Run(tc.name, func(t *testing.T) { testLoaderRewatch(t, tc.gone) })
	}
}

func testLoaderRewatch(t *testing.T, gone func(dir string) error) {
	dir := filepath.Join(t.TempDir(), "conf")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	if err := w.Add(dir); err != nil {
		t.Fatal(err)
	}
	l := &loader{path: filepath.Join(dir, "demo.yaml"), dir: dir, watcher: w}
	if l.dirInfo, err = os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	if err := gone(dir); err != nil {
		t.Fatal(err)
	}
	// Run takes the events as they come: so does this, until the
	// watch has seen the directory go.
	for gone := false; !gone; {
		select {
		case ev := <-w.Events:
			gone = ev.Name == dir && (ev.Has(fsnotify.Rename) || ev.Has(fsnotify.Remove))
		case err := <-w.Errors:
			t.Fatal(err)
		case <-time.After(watchTimeout):
			t.Fatal("the watch did not see the directory go")
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l.rewatch()
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if l.dirInfo == nil || !os.SameFile(fi, l.dirInfo) || !slices.Contains(w.WatchList(), dir) {
		t.Fatalf("the new directory is not the one watched (watching %q)", w.WatchList())
	}
	if err := os.WriteFile(l.path, []byte("a: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(watchTimeout)
	for {
		select {
		case ev := <-w.Events:
			if l.relevant(ev) {
				return
			}
		case err := <-w.Errors:
			t.Fatal(err)
		case <-timeout:
			t.Fatalf("no event for %s in the new directory within %s", l.path, watchTimeout)
		}
	}
}

// next returns the outcome of the next read of the file.
func (w *watchRun) next() reloadResult {
	w.t.Helper()
	select {
	case r := <-w.reloads:
		return r
	case <-time.After(watchTimeout):
		w.t.Fatalf("no read of the file within %s", watchTimeout)
	}
	return reloadResult{}
}

// TestManifestsHostChangedRebuilds: when this host's addresses change, the
// unchanged file is built again: an endpoint now at one of them with a
// node port is left out (kube-proxy translates a connection once), and
// the snapshot without it applied.
func TestManifestsHostChangedRebuilds(t *testing.T) {
	w, first, _, hostBecomes := runWithHostAddrs(t, webAndNodePort(31000, "192.0.2.9", "10.0.0.4"))
	if got := webEndpoints(t, first); !slices.Equal(got, []string{"10.0.0.4:31000", "192.0.2.9:31000"}) {
		t.Fatalf("first snapshot: %q", got)
	}
	hostBecomes("192.0.2.9")
	if r := w.next(); r.outcome != outcomeApplied || r.err != nil {
		t.Fatalf("after the host change: outcome %d (%v), want applied", r.outcome, r.err)
	}
	if got := webEndpoints(t, w.snapshot()); !slices.Equal(got, []string{"10.0.0.4:31000"}) {
		t.Fatalf("after the host change: %q, want 192.0.2.9 left out", got)
	}
}

// webAndNodePort is a manifest of a NodePort Service on nodePort and a
// Service web whose endpoints, at addrs, listen on that same port.
func webAndNodePort(nodePort int, addrs ...string) string {
	var eps []string
	for _, a := range addrs {
		eps = append(eps, "{addresses: ["+a+"]}")
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: np, namespace: demo}
spec: {type: NodePort, ports: [{port: 80, nodePort: %[1]d}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: %[1]d}]
endpoints: [%s]
`, nodePort, strings.Join(eps, ", "))
}

// runWithHostAddrs runs a Manifests on a file holding data, on a host
// without addresses until hostBecomes gives it some and says so.
func runWithHostAddrs(t *testing.T, data string) (w *watchRun, first state.Snapshot, path string, hostBecomes func(addrs ...string)) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "demo.yaml")
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var host []netip.Addr
	changed := make(chan struct{}, 1)
	w, first = runManifests(t, &Manifests{
		Path: path,
		Options: Options{AllowNoClusterIP: true, HostAddrs: func() ([]netip.Addr, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(host), nil
		}},
		Debounce:    20 * time.Millisecond,
		Resync:      -1,
		HostChanged: changed,
	})
	hostBecomes = func(addrs ...string) {
		mu.Lock()
		host = host[:0]
		for _, a := range addrs {
			host = append(host, netip.MustParseAddr(a))
		}
		mu.Unlock()
		changed <- struct{}{}
	}
	return w, first, path, hostBecomes
}

// TestManifestsStatusToldUnreadableFile: a file that cannot be read (gone
// while an editor replaces it) is told to Status as the reason the file
// is refused, as a broken edit is; /debug/services shows it.
func TestManifestsStatusToldUnreadableFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.yaml")
	if err := os.WriteFile(path, []byte(manifestWith("127.0.0.1")), 0o644); err != nil {
		t.Fatal(err)
	}
	rejected := make(chan error, 16)
	w, _ := runManifests(t, &Manifests{
		Path:     path,
		Options:  Options{AllowLoopback: true, AllowNoClusterIP: true},
		Debounce: 20 * time.Millisecond,
		Resync:   -1,
		Status:   func(r error, _, _ []error) { rejected <- r },
	})
	if r := <-rejected; r != nil {
		t.Fatalf("first read told as refused: %v", r)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := w.waitFor(outcomeRejected); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after delete: %v, want a not-exist error", err)
	}
	select {
	case r := <-rejected:
		if !errors.Is(r, os.ErrNotExist) {
			t.Fatalf("Status told %v, want the not-exist error", r)
		}
	default:
		t.Fatal("Status was not told the file could not be read")
	}
}

// TestManifestsKeepsChangingFileRead: a file written again and again,
// each write within the debounce of the last, is read all the same once
// ten debounces have passed, not only when the writes stop.
func TestManifestsKeepsChangingFileRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.yaml")
	if err := os.WriteFile(path, []byte(manifestWith("127.0.0.1")), 0o644); err != nil {
		t.Fatal(err)
	}
	const debounce = 200 * time.Millisecond
	w, _ := runManifests(t, &Manifests{
		Path:     path,
		Options:  Options{AllowLoopback: true, AllowNoClusterIP: true},
		Debounce: debounce,
		Resync:   -1,
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() }) // before the directory goes
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(debounce / 10)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
				if err := os.WriteFile(path, []byte(manifestWith([]string{"127.0.0.2", "127.0.0.3"}[i%2])), 0o644); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	r := w.next() // while the writes go on
	if r.outcome == outcomeUnchanged {
		t.Fatalf("first read while writing: unchanged, want the new content")
	}
}

// TestManifestsNamesThePathAsGiven: messages name the file as given
// (--manifests demo.yaml), not made absolute.
func TestManifestsNamesThePathAsGiven(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.WriteFile("demo.yaml", []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 0}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := (&Manifests{Path: "demo.yaml"}).Check(context.Background())
	want := "manifests: demo.yaml:4: document 1 (Service default/web): spec.ports[0].port: 0 is out of range 1-65535"
	if err == nil || err.Error() != want {
		t.Fatalf("got  %v\nwant %s", err, want)
	}
}
