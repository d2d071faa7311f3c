// Package netnstest holds what the tests that create network namespaces
// share. Network namespaces are Linux's: elsewhere it is empty.
package netnstest
