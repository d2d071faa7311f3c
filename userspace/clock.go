package userspace

import "time"

// Clock tells the time. Affinity expiry reads it, so tests can move time
// forward without sleeping.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
