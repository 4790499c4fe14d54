"""Rules on feeding the step: the loader, its workers, copies to the device, storage, batch building."""
