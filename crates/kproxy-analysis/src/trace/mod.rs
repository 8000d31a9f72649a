//! Path view of a service and the packet simulator (one matching engine, two walk models).

pub mod conntrack;
pub mod ipvs;
pub mod partial;
pub mod path;
pub mod sim;
