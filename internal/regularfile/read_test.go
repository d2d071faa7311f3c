package regularfile

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadAllocatesTheFileOnce: reading a file allocates one buffer of its
// size (and one byte, to see its end), where io.ReadAll read into chunks
// of growing size and copied them into one, twice the file's size at the
// end (a 16 MiB file: 36.2 MB in 38 allocations, 2.16 times the file).
// The whole Read, open and stat included, allocates less than the file
// and 64 KiB.
func TestReadAllocatesTheFileOnce(t *testing.T) {
	const size = 16 << 20
	for _, tc := range []struct {
		name  string
		limit int
	}{
		{"under the limit", 64 << 20},
		{"of exactly the limit", size},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "big.yaml")
			want := bytes.Repeat([]byte("0123456789abcde\n"), size/16)
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			var data []byte
			var err error
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			allocs := testing.AllocsPerRun(1, func() { data, err = Read(path, tc.limit) })
			runtime.ReadMemStats(&after)
			if err != nil || !bytes.Equal(data, want) {
				t.Fatalf("read %d bytes, %v; want the file's %d", len(data), err, size)
			}
			// AllocsPerRun runs the function twice: once to warm up.
			allocated := (after.TotalAlloc - before.TotalAlloc) / 2
			t.Logf("%d allocations, %d bytes (%.2f times the file)", int(allocs), allocated, float64(allocated)/size)
			if allocated > size+64<<10 {
				t.Errorf("a read of a %d-byte file allocated %d bytes, want its size and less than 64 KiB more", size, allocated)
			}
			if allocs > 12 {
				t.Errorf("a read allocated %v times, want at most 12", allocs)
			}
		})
	}
}

// TestReadUpTo: the buffer sized by what the file says is grown when the
// file holds more (a file of /proc says 0; a file may grow while read),
// never past the limit and one byte, and let go when the file holds far
// less; any short reads, data with the end, and an error are taken as
// io.ReadAll took them.
func TestReadUpTo(t *testing.T) {
	const limit = 10000
	text := func(n int) []byte { return []byte(strings.Repeat("abcdefghij", n/10+1)[:n]) }
	for _, tc := range []struct {
		name    string
		holds   int
		says    int64
		wrap    func(io.Reader) io.Reader
		over    bool
		maxCap  int // of the data returned
		wantErr error
	}{
		{name: "what it says", holds: 5000, says: 5000, maxCap: 5001},
		{name: "what it says, a byte at a time", holds: 5000, says: 5000, wrap: iotest.OneByteReader, maxCap: 5001},
		{name: "what it says, the end with the data", holds: 5000, says: 5000, wrap: iotest.DataErrReader, maxCap: 5001},
		{name: "empty", holds: 0, says: 0, maxCap: minRead},
		{name: "says 0, as /proc", holds: 3000, says: 0, maxCap: 2 * 3000},
		{name: "grew while read", holds: 7000, says: 1000, maxCap: 2 * 7000},
		{name: "grew to the limit", holds: limit, says: 1000, maxCap: limit + 1},
		{name: "grew past the limit", holds: limit + 1, says: 1000, over: true},
		{name: "grew far past the limit, half a read at a time", holds: 3 * limit, says: 0, wrap: iotest.HalfReader, over: true},
		{name: "shrank while read", holds: 100, says: 9000, maxCap: minRead},
		{name: "says more than the limit", holds: 50, says: 1 << 40, maxCap: minRead},
		{name: "a read fails", holds: 5000, says: 5000, wrap: func(r io.Reader) io.Reader {
			return io.MultiReader(io.LimitReader(r, 100), iotest.ErrReader(errBroken))
		}, wantErr: errBroken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := text(tc.holds)
			var r io.Reader = bytes.NewReader(want)
			if tc.wrap != nil {
				r = tc.wrap(r)
			}
			data, over, err := readUpTo(r, tc.says, limit)
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) || data != nil || over {
					t.Fatalf("got %d bytes, over %v, %v; want %v", len(data), over, err, tc.wantErr)
				}
			case tc.over:
				if !over || data != nil || err != nil {
					t.Fatalf("got %d bytes, over %v, %v; want over the limit", len(data), over, err)
				}
			default:
				if over || err != nil || !bytes.Equal(data, want) {
					t.Fatalf("got %d bytes, over %v, %v; want the %d bytes", len(data), over, err, len(want))
				}
				if cap(data) > tc.maxCap {
					t.Errorf("the data holds a buffer of %d bytes, want at most %d", cap(data), tc.maxCap)
				}
			}
		})
	}
}

var errBroken = errors.New("broken")
