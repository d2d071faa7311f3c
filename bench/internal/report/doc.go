// Package report turns the benchmark's results into plain-text tables, one
// per test, with each peer's ratio to the no-proxy limit and our proxy's
// ratio to each peer, and into a JSON document for machines.
//
// It owns the formatting only; measuring is the job of packages load and
// procstat, and deciding what to measure is the job of package suite.
//
//	report.WriteText(os.Stdout, run)
//	report.WriteJSON("bench/results/latest.json", run)
package report
