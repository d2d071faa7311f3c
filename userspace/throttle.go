package userspace

import (
	"sync/atomic"
	"time"
)

// logThrottle lets a message that may repeat quickly through at most once
// per period, with how many times it happened since it last went through.
type logThrottle struct {
	count atomic.Int64
	last  atomic.Int64 // unix nanoseconds of the last time it went through
}

// note counts one occurrence. It reports whether to log now, the first
// time and then at most once every period, and if so how many occurrences
// the line stands for.
func (t *logThrottle) note(period time.Duration) (int64, bool) {
	t.count.Add(1)
	now, last := time.Now().UnixNano(), t.last.Load()
	if last != 0 && now-last < int64(period) || !t.last.CompareAndSwap(last, now) {
		return 0, false
	}
	return t.count.Swap(0), true
}
