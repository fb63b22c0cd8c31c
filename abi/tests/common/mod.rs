//! Shared by the abi's integration tests that export a fake net plugin.

/// The items of a `Net` impl that such a fake does not care about: one device
/// with no properties, `()` contexts and memory registrations, `u32` comms,
/// `Box<u8>` requests that are done at once, and sends that never start. Each test
/// writes the calls it watches (`listen`, `connect`, `accept`, `irecv` …) itself.
macro_rules! fake_net_basics {
    () => {
        type Context = ();
        type ListenComm = u32;
        type SendComm = u32;
        type RecvComm = u32;
        type Mr = ();
        type Request = Box<u8>;

        fn init(_: &cclkit_abi::net::InitArgs) -> cclkit_abi::error::Result<Self> {
            Ok(Self)
        }
        fn devices(&self) -> usize {
            1
        }
        fn properties(&self, _: usize) -> cclkit_abi::error::Result<cclkit_abi::net::Properties> {
            Err(cclkit_abi::error::Error::unsupported("properties"))
        }
        fn open_context(
            &self,
            _: u64,
            _: cclkit_abi::net::CommConfig,
        ) -> cclkit_abi::error::Result<()> {
            Ok(())
        }
        fn reg_mr(
            &self,
            _: cclkit_abi::net::CommRef<'_, Self>,
            _: cclkit_abi::net::MemRegion,
        ) -> cclkit_abi::error::Result<()> {
            Ok(())
        }
        fn isend(
            &self,
            _: &mut u32,
            _: cclkit_abi::net::Buf,
            _: i32,
            _: Option<&()>,
        ) -> cclkit_abi::error::Result<Option<Box<u8>>> {
            Ok(None)
        }
        fn test(
            _: &mut Box<u8>,
            _: &mut cclkit_abi::net::Sizes<'_>,
        ) -> cclkit_abi::error::Result<bool> {
            Ok(true)
        }
    };
}
