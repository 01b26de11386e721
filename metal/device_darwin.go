package metal

/*
#cgo CFLAGS: -x objective-c -fno-objc-arc
#cgo LDFLAGS: -framework Metal -framework Foundation
#import <Metal/Metal.h>

// darwinkit v0.5.0 binds neither function. MTLCreateSystemDefaultDevice
// returns nil in processes without a window-server session (launchd
// daemons, ssh), where MTLCopyAllDevices still lists the GPU. Both return
// retained objects; the caller releases the device.
static void* rmsgrad_metal_device(void) {
	id<MTLDevice> d = MTLCreateSystemDefaultDevice();
	if (d != nil) {
		return (void*)d;
	}
	NSArray<id<MTLDevice>>* all = MTLCopyAllDevices();
	if (all == nil) {
		return NULL;
	}
	if (all.count > 0) {
		d = [all[0] retain];
	}
	[all release];
	return (void*)d;
}
*/
import "C"

import (
	"unsafe"

	"github.com/progrium/darwinkit/macos/metal"
	"github.com/progrium/darwinkit/objc"
)

// systemDevice returns the default Metal device (retained), or a nil object.
func systemDevice() metal.DeviceObject {
	p := unsafe.Pointer(C.rmsgrad_metal_device())
	return metal.DeviceObject{Object: objc.ObjectFrom(p)}
}
