# systemd/: unit files generated for installation (and for the verify test), and their install rules.
# The checked-in units name /usr/bin/tandemd and /etc/tandem/tandemd.conf, what a distribution
# package (prefix /usr) installs; other prefixes get their own paths substituted here.
set(TANDEM_SYSTEMD_SYSTEM_UNITDIR "lib/systemd/system" CACHE STRING "system units, relative to the prefix")
set(TANDEM_SYSTEMD_USER_UNITDIR "lib/systemd/user" CACHE STRING "user units, relative to the prefix")
set(TANDEM_SYSUSERSDIR "lib/sysusers.d" CACHE STRING "sysusers.d entries, relative to the prefix")
set(TANDEM_TMPFILESDIR "lib/tmpfiles.d" CACHE STRING "tmpfiles.d entries, relative to the prefix")

set(TANDEM_UNITS tandemd.service tandemd.socket user/tandemd.service user/tandemd.socket)

# tandem_generate_units(OUT_DIR TANDEMD CONF): copies of the units with ExecStart's binary
# and config path replaced.
function(tandem_generate_units out_dir tandemd conf)
  foreach(unit IN LISTS TANDEM_UNITS)
    set(src ${PROJECT_SOURCE_DIR}/systemd/${unit})
    set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${src})
    file(READ ${src} text)
    string(REPLACE "/usr/bin/tandemd" "${tandemd}" text "${text}")
    string(REPLACE "/etc/tandem/tandemd.conf" "${conf}" text "${text}")
    file(WRITE ${out_dir}/${unit} "${text}")
  endforeach()
endfunction()

tandem_generate_units(${PROJECT_BINARY_DIR}/systemd/install
  ${CMAKE_INSTALL_FULL_BINDIR}/tandemd ${CMAKE_INSTALL_FULL_SYSCONFDIR}/tandem/tandemd.conf)

install(FILES ${PROJECT_BINARY_DIR}/systemd/install/tandemd.service ${PROJECT_BINARY_DIR}/systemd/install/tandemd.socket
        DESTINATION ${TANDEM_SYSTEMD_SYSTEM_UNITDIR})
install(FILES ${PROJECT_BINARY_DIR}/systemd/install/user/tandemd.service
              ${PROJECT_BINARY_DIR}/systemd/install/user/tandemd.socket
        DESTINATION ${TANDEM_SYSTEMD_USER_UNITDIR})
install(FILES systemd/sysusers.d/tandem.conf DESTINATION ${TANDEM_SYSUSERSDIR})
install(FILES systemd/tmpfiles.d/tandem.conf DESTINATION ${TANDEM_TMPFILESDIR})
install(FILES systemd/tandemd.conf README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
# The live configuration is the admin's: installed only where there is none yet. The prefix
# /usr keeps its configuration in /etc, as GNUInstallDirs has it.
install(CODE "set(TANDEM_SAMPLE_CONF \"${PROJECT_SOURCE_DIR}/systemd/tandemd.conf\")")
install(CODE [[
  if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
    set(tandem_etc "$ENV{DESTDIR}/etc/tandem")
  else()
    set(tandem_etc "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/etc/tandem")
  endif()
  if(EXISTS "${tandem_etc}/tandemd.conf")
    message(STATUS "Keeping: ${tandem_etc}/tandemd.conf")
  else()
    file(INSTALL "${TANDEM_SAMPLE_CONF}" DESTINATION "${tandem_etc}")
  endif()
]])
