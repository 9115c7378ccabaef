# systemd/: unit files generated for installation (and for the verify test), and their install rules.
# The checked-in units name /usr/bin/tandemd and /etc/tandem/tandemd.conf, what a distribution
# package (prefix /usr) installs; other prefixes get their own paths substituted at install time.
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

# The installed units, the config path and the docs path depend on the prefix given at install
# time (`cmake --install build --prefix /usr`), not the configure-time one, so the units are
# written by the install script itself. file(INSTALL) adds $DESTDIR to every destination; the
# paths written into the units never contain it.
install(CODE "set(TANDEM_SRC \"${PROJECT_SOURCE_DIR}\")
  set(TANDEM_STAGE \"${PROJECT_BINARY_DIR}/systemd/install\")
  set(TANDEM_UNITS \"${TANDEM_UNITS}\")
  set(TANDEM_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(TANDEM_SYSCONFDIR \"${CMAKE_INSTALL_SYSCONFDIR}\")
  set(TANDEM_DOCDIR \"${CMAKE_INSTALL_DOCDIR}\")
  set(TANDEM_UNITDIRS \"${TANDEM_SYSTEMD_SYSTEM_UNITDIR};${TANDEM_SYSTEMD_SYSTEM_UNITDIR};${TANDEM_SYSTEMD_USER_UNITDIR};${TANDEM_SYSTEMD_USER_UNITDIR}\")")
install(CODE [[
  # Relative dirs are under the prefix; the prefix /usr keeps its configuration in /etc, as
  # GNUInstallDirs has it.
  function(tandem_full out dir)
    if(IS_ABSOLUTE "${dir}")
      set(${out} "${dir}" PARENT_SCOPE)
    else()
      set(${out} "${CMAKE_INSTALL_PREFIX}/${dir}" PARENT_SCOPE)
    endif()
  endfunction()
  tandem_full(tandem_bin "${TANDEM_BINDIR}")
  tandem_full(tandem_doc "${TANDEM_DOCDIR}")
  if(IS_ABSOLUTE "${TANDEM_SYSCONFDIR}")
    set(tandem_etc "${TANDEM_SYSCONFDIR}/tandem")
  elseif(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
    set(tandem_etc "/etc/tandem")
  else()
    set(tandem_etc "${CMAKE_INSTALL_PREFIX}/${TANDEM_SYSCONFDIR}/tandem")
  endif()
  foreach(unit dir IN ZIP_LISTS TANDEM_UNITS TANDEM_UNITDIRS)
    file(READ "${TANDEM_SRC}/systemd/${unit}" text)
    string(REPLACE "/usr/bin/tandemd" "${tandem_bin}/tandemd" text "${text}")
    string(REPLACE "/etc/tandem/tandemd.conf" "${tandem_etc}/tandemd.conf" text "${text}")
    string(REPLACE "/usr/share/doc/tandem" "${tandem_doc}" text "${text}")
    file(WRITE "${TANDEM_STAGE}/${unit}" "${text}")
    tandem_full(dest "${dir}")
    file(INSTALL "${TANDEM_STAGE}/${unit}" DESTINATION "${dest}")
  endforeach()
  # The live configuration is the admin's: installed only where there is none yet.
  if(EXISTS "$ENV{DESTDIR}${tandem_etc}/tandemd.conf")
    message(STATUS "Keeping: $ENV{DESTDIR}${tandem_etc}/tandemd.conf")
  else()
    file(INSTALL "${TANDEM_SRC}/systemd/tandemd.conf" DESTINATION "${tandem_etc}")
  endif()
]])
install(FILES systemd/sysusers.d/tandem.conf DESTINATION ${TANDEM_SYSUSERSDIR})
install(FILES systemd/tmpfiles.d/tandem.conf DESTINATION ${TANDEM_TMPFILESDIR})
install(FILES systemd/tandemd.conf README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
