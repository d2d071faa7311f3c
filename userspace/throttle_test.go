package userspace

import (
	"sync"
	"testing"
	"time"
)

// TestLogThrottleOncePerPeriod: note lets the first occurrence through,
// holds back the others within the period, and, once the period is over,
// lets one through that counts them all, itself included. The period is
// an hour, so that no wait of the test's ends it; its end is made by
// moving the last time back.
func TestLogThrottleOncePerPeriod(t *testing.T) {
	var th logThrottle
	if n, ok := th.note(time.Hour); !ok || n != 1 {
		t.Fatalf("first note: %d, %v; want 1, true", n, ok)
	}
	for i := range 5 {
		if n, ok := th.note(time.Hour); ok {
			t.Fatalf("note %d within the period went through, saying %d", i+2, n)
		}
	}
	th.last.Store(time.Now().Add(-time.Hour - time.Second).UnixNano()) // the period is over
	if n, ok := th.note(time.Hour); !ok || n != 6 {
		t.Fatalf("first note after the period: %d, %v; want 6 (5 held back and itself), true", n, ok)
	}
	if n, ok := th.note(time.Hour); ok {
		t.Fatalf("a note just after one went through went through too, saying %d", n)
	}

	// Many at once: one goes through, and the counts lose none.
	var par logThrottle
	const n = 64
	var wg sync.WaitGroup
	var mu sync.Mutex
	through, counted := 0, int64(0)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c, ok := par.note(time.Hour); ok {
				mu.Lock()
				through++
				counted += c
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	held := par.count.Load()
	if through != 1 || counted+held != n {
		t.Errorf("%d notes at once: %d went through, counting %d, %d held back; want 1 through and %d in all", n, through, counted, held, n)
	}
}
