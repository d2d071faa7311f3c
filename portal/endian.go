package portal

import "encoding/binary"

// bigEndian says this machine stores words most significant byte first.
var bigEndian = binary.NativeEndian.Uint16([]byte{0, 1}) == 1
